#!/usr/bin/env bash
# Sets everything up (see setup.sh) and runs `pandastack serve` in the
# foreground with its defaults: API on 127.0.0.1:8080, data in
# /var/lib/pandastack. Extra arguments go to serve.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec bin/pandastack serve "$@"
