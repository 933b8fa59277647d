#!/usr/bin/env bash
# Sets everything up (see setup.sh) and runs the whole test suite: the Go
# tests, which include end-to-end tests of the real binary with real gVisor
# sandboxes. Under CI=true a missing prerequisite fails instead of skipping.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
CACHE=${PANDASTACK_CACHE_DIR:-/var/cache/pandastack}
GO_WANT=$(sed -n 's/^go \([0-9.]*\)$/\1/p' go.mod)
for d in "$CACHE"/go/go*/bin; do [ -x "$d/go" ] && PATH="$d:$PATH"; done
export PATH GOTOOLCHAIN=local PANDASTACK_CACHE_DIR="$CACHE"

echo "==> go vet ./..." >&2
go vet ./...
echo "==> go test ./..." >&2
go test -count=1 -timeout 45m ./...
