#!/usr/bin/env bash
# walk-budget.sh: the walk of a request, the *http.Request of
# proxy.Proxy.serve followed through every function it (or a value made
# from it) enters, read statically by farm-studio, within its budget: at
# most $max_stays stays (runs of calls into one file) and no file entered
# more than $max_visits times. A newcomer reads the request's way top to
# bottom in few files; a change that scatters it fails here.
#
# farm-studio is the house-drawing tool of the machines this project is
# built on (CI runs there); where it is missing the check says so and
# passes, as the figures cannot be read.
set -euo pipefail
cd "$(dirname "$0")/.."
max_stays=${WALK_MAX_STAYS:-20}
max_visits=${WALK_MAX_VISITS:-2}
if ! command -v farm-studio >/dev/null; then
  echo "walk budget: farm-studio not installed here; not checked"
  exit 0
fi
out=$(farm-studio walk proxy/serve.go:Proxy.serve:r)
stays=$(sed -n 's/^\([0-9][0-9]*\) stays;.*/\1/p' <<<"$out")
if [ -z "$stays" ]; then
  echo "walk budget: no stay count in farm-studio's output:"; echo "$out"; exit 1
fi
# The most visits of one file: "VISIT n" marks the n-th entry of a file.
visits=$(grep -o 'VISIT [0-9]*' <<<"$out" | awk '{ if ($2 > m) m = $2 } END { print m + 0 }')
[ "$visits" -eq 0 ] && visits=1
echo "walk budget: $stays stays (budget $max_stays), at most $visits entries of one file (budget $max_visits)"
if [ "$stays" -gt "$max_stays" ] || [ "$visits" -gt "$max_visits" ]; then
  grep -E '^ *[0-9]+\. ' <<<"$out" | cut -c1-160
  echo "walk budget: over; see CONTRIBUTING.md, Budgets"
  exit 1
fi
