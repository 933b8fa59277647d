#!/usr/bin/env bash
# Runs the TypeScript SDK's tests (sdk/typescript/test) against a real
# `pandastack serve` that the suite's runner (test/run.ts) starts on a free
# loopback port with a temporary data dir, then cleans up. Needs Node 20+,
# bin/pandastack (scripts/setup.sh builds it; or set PANDASTACK_BIN) and root,
# like the server. Under CI=true a missing prerequisite fails instead of
# skipping. Arguments go to `node --test`, e.g.
#   scripts/test-typescript.sh --test-name-pattern=files
#   scripts/test-typescript.sh test-dist/code.test.js
set -euo pipefail
cd "$(dirname "$0")/../sdk/typescript"

# Node 20 or newer (global fetch, web streams), fetched into the cache if
# this machine has none.
source ../../scripts/node-env.sh || exit 1
export PATH

if [ -f package-lock.json ]; then
	echo "==> npm ci" >&2
	npm ci --no-audit --no-fund
else
	echo "==> npm install (no package-lock.json)" >&2
	npm install --no-audit --no-fund
fi
echo "==> npm run build" >&2
npm run build
echo "==> npm test $*" >&2
npm test -- "$@"
