#!/usr/bin/env bash
# A short round of every benchmark: the figures CI printed until issue 50
# (CI now runs each command on a tiny load only, to keep it working; see
# CONTRIBUTING.md). Each command
# prints a table and its targets, met or not; a target missed does not
# fail the round, so read the tables. A round takes about ten minutes
# on a 2-core machine. Each line is also the way to run that part
# alone, and its flags (-scenario, -runs, -markdown) the way to a full
# matrix (see docs/benchmarks.md).
#
# Needs redis-server (replicabench) and wrk, hey and nginx (overhead);
# the Node clients are not needed.
# Usage: scripts/bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
go build -o "$work/llmproxy" ./cmd/llmproxy

echo "== loadbench: makespan against the limits on real sockets: silent upstreams, the Anthropic form, a configured ceiling, a local model server"
go run ./e2e/loadbench -direct=false -scenario 'short/silent,streams/silent,concurrency/silent,quantized-anthropic/headers,configured/silent,local/interleaved'

echo "== loadbench: one cell of each shape of limit: a fixed window, one limit shared by four models, resets rounded down, refusals that count, answer times that vary"
go run ./e2e/loadbench -direct=false -scenario 'window/retry-after,shared-models/headers,anthropic-rounded-down/headers,counted/silent,streams-jitter/silent'

echo "== loadbench: issue 48's rows, upstreams written apart from the mock, through the built binary (a draw of TestUniverse replays with -universe SEED)"
go run ./e2e/loadbench -scenario 'universe/*' -bin "$work/llmproxy"

echo "== fairbench: a small run on a key beside a big one, with and without x-llmproxy-client (short; the README's figures: go run ./e2e/fairbench)"
go run ./e2e/fairbench -n 300 -c 100 -start 2s -bin "$work/llmproxy"

echo "== replicabench: three replicas on one redis-server against one proxy, Redis killed mid-run, a fixed window, a Redis Cluster losing a primary, one limit shared by four models (every row: go run ./e2e/replicabench)"
go run ./e2e/replicabench -scenario short,redis-killed,window/retry-after,cluster-keys,universe/shared-models-quantized -bin "$work/llmproxy"

echo "== overhead: what the proxy costs when nothing is limited, against nginx (one short round; docs/benchmarks.md's table: go run ./e2e/overhead)"
go run ./e2e/overhead -rounds 1 -duration 1s -bin "$work/llmproxy"

echo "== BenchmarkServeHTTP: the hot path's time and allocations"
go test -run '^$' -bench '^BenchmarkServeHTTP' -benchtime 20000x -benchmem ./proxy
