#!/usr/bin/env bash
# Sets everything up (see setup.sh) and runs the whole test suite: the Go
# tests (which include end-to-end tests of the real binary with real gVisor
# sandboxes), then the Python and TypeScript SDK suites against a real
# server, then the web console and the data-analyst example in a headless
# Chromium. Under CI=true a missing prerequisite fails instead of skipping.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
CACHE=${PANDASTACK_CACHE_DIR:-/var/cache/pandastack}
# The Go setup chose and built with (setup.sh).
if [ -s "$CACHE/go/selected" ]; then PATH="$(cat "$CACHE/go/selected")/bin:$PATH"; fi
export PATH GOTOOLCHAIN=local PANDASTACK_CACHE_DIR="$CACHE"
# Node for the TypeScript suite, checked (and fetched) before the long Go one.
source ./scripts/node-env.sh
export PATH
# A Python with ipykernel for the Jupyter client's tests on the host.
PANDASTACK_TEST_PYTHON=$(./scripts/test-python-env.sh)
export PANDASTACK_TEST_PYTHON

echo "==> go vet ./..." >&2
go vet ./...
echo "==> go test ./..." >&2
go test -count=1 -timeout 45m ./...
# The packages whose goroutines share the most state, again under the race
# detector (a race there is a bug whatever the tests' other outcomes).
echo "==> go test -race (sandbox manager, API, network, agent)" >&2
CGO_ENABLED=1 go test -race -count=1 -timeout 20m ./internal/sandbox/ ./internal/api/ ./internal/network/ ./internal/agent/
echo "==> Python SDK tests" >&2
./scripts/test-python.sh
echo "==> TypeScript SDK tests" >&2
./scripts/test-typescript.sh
echo "==> Browser tests (web console, data-analyst example)" >&2
./scripts/test-browser.sh
