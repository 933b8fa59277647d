#!/usr/bin/env bash
# Runs every fuzz target for a while each: ./scripts/fuzz.sh [DURATION]
# (default 30s; any `go test -fuzztime` value). The targets' seed corpora
# also run as ordinary tests in `go test ./...`. A failing input is saved
# under the package's testdata/fuzz/<Target>/ by go test: commit it with the
# fix, so it stays a regression test.
set -uo pipefail
cd "$(dirname "$0")/.."
TIME=${1:-30s}
# package, target: one decoder of untrusted input each.
TARGETS=(
  "./internal/api FuzzDecodeBody"         # API request bodies
  "./internal/agentproto FuzzFrames"      # agent frames from the pipes
  "./internal/agentproto FuzzCheckPath"   # file paths from clients
  "./internal/agentproto FuzzCheckEnv"    # environment variables from clients
  "./internal/agent FuzzGuard"            # file paths inside the sandbox
  "./internal/template FuzzParseSpec"     # template specs
)
failed=0
for t in "${TARGETS[@]}"; do
  set -- $t
  start=$(date +%s)
  if go test -parallel "${FUZZ_PARALLEL:-1}" -run '^$' -fuzz "^$2\$" -fuzztime "$TIME" "$1" >"${TMPDIR:-/tmp}/fuzz-$2.log" 2>&1; then
    result=ok
  else
    result=FAILED
    failed=1
  fi
  execs=$(grep -o 'execs: [0-9]*' "${TMPDIR:-/tmp}/fuzz-$2.log" | tail -1)
  printf '%-14s %-22s %s in %ss (%s)\n' "$1" "$2" "$result" "$(( $(date +%s) - start ))" "${execs:-execs: ?}"
  if [ "$result" = FAILED ]; then
    tail -30 "${TMPDIR:-/tmp}/fuzz-$2.log"
  fi
  rm -f "${TMPDIR:-/tmp}/fuzz-$2.log"
done
exit $failed
