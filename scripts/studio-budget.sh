#!/usr/bin/env bash
# studio-budget.sh: the budgets only farm-studio can read, held as
# internal/shape holds the others (CONTRIBUTING.md, Budgets):
#
#   - the walk of a request, the *http.Request of proxy.Proxy.serve
#     followed through every function it (or a value made from it)
#     enters, read statically: at most WALK_MAX_STAYS stays (runs of calls
#     into one file) and no file entered more than WALK_MAX_VISITS times,
#     so a newcomer reads the request's way top to bottom in few files;
#   - the arrows that run back up inside a package (a file using one
#     drawn above it, `farm-studio look PKG`), at most the package's row
#     in arrows_budget, so each package keeps an order from the files
#     that decide down to the ones they use.
#
# farm-studio is the house-drawing tool of the machines this project is
# built on (CI runs there); where it is missing the check says so and
# passes, as the figures cannot be read.
set -euo pipefail
cd "$(dirname "$0")/.."
max_stays=${WALK_MAX_STAYS:-20}
max_visits=${WALK_MAX_VISITS:-2}
declare -A arrows_budget=([lanequeue]=4 [proxy]=8 [limit]=4)
if ! command -v farm-studio >/dev/null; then
  echo "studio budget: farm-studio not installed here; not checked"
  exit 0
fi
over=0

out=$(farm-studio walk proxy/serve.go:Proxy.serve:r)
stays=$(sed -n 's/^\([0-9][0-9]*\) stays;.*/\1/p' <<<"$out")
if [ -z "$stays" ]; then
  echo "studio budget: no stay count in farm-studio's walk:"; echo "$out"; exit 1
fi
# The most entries of one file: "VISIT n" marks a file's n-th.
visits=$(grep -o 'VISIT [0-9]*' <<<"$out" | awk '{ if ($2 > m) m = $2 } END { print (m > 0 ? m : 1) }')
echo "walk of a request: $stays stays (budget $max_stays), at most $visits entries of one file (budget $max_visits)"
if [ "$stays" -gt "$max_stays" ] || [ "$visits" -gt "$max_visits" ]; then
  grep -E '^ *[0-9]+\. ' <<<"$out" | cut -c1-160
  over=1
fi

for pkg in "${!arrows_budget[@]}"; do
  n=$(farm-studio look "$pkg" | head -1 | sed -n 's/.*"arrows that run back up": \([0-9]*\).*/\1/p')
  if [ -z "$n" ]; then
    echo "studio budget: no arrow count in farm-studio's look at $pkg"; exit 1
  fi
  echo "$pkg: $n arrows back up (budget ${arrows_budget[$pkg]})"
  if [ "$n" -gt "${arrows_budget[$pkg]}" ]; then over=1; fi
done

if [ "$over" -ne 0 ]; then
  echo "studio budget: over; see CONTRIBUTING.md, Budgets"
  exit 1
fi
