#!/usr/bin/env bash
# Runs the Python SDK's test suite (sdk/python/tests) against a real
# `pandastack serve` that the suite's fixture starts on a free port. Needs
# bin/pandastack (scripts/setup.sh builds it) and root, like the server.
#
# The venv is made once under
# ${PANDASTACK_CACHE_DIR:-/var/cache/pandastack}/venvs/sdk-<hash>, keyed by
# sdk/python/pyproject.toml, this script's requirements and the base
# interpreter; the SDK is installed editable, so edits to its source need no
# reinstall. Arguments go to pytest, e.g. scripts/test-python.sh -k files -x,
# or scripts/test-python.sh sdk/python/tests/integrations
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
CACHE=${PANDASTACK_CACHE_DIR:-/var/cache/pandastack}
# The suites talk to their server on loopback: never through a proxy of the
# environment (httpx, unlike Go, has no rule of its own for loopback).
for v in NO_PROXY no_proxy; do
  export "$v=${!v:+${!v},}127.0.0.1,localhost,::1"
done
# Besides the [dev] extra: what the install itself needs.
EXTRA_REQUIREMENTS='pip>=23
hatchling>=1.21'

base_version=$("$PYTHON" -c 'import sys; print(sys.version)')
hash=$({ cat sdk/python/pyproject.toml; printf '%s\n%s\n' "$EXTRA_REQUIREMENTS" "$base_version"; } | sha256sum | cut -c1-12)
venv="$CACHE/venvs/sdk-$hash"

if [ ! -f "$venv/.complete" ]; then
	echo "==> creating the SDK test venv in $venv" >&2
	rm -rf "$venv"
	mkdir -p "$CACHE/venvs"
	"$PYTHON" -m venv "$venv"
	"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r /dev/stdin <<<"$EXTRA_REQUIREMENTS"
	"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e "sdk/python[dev]"
	touch "$venv/.complete"
fi
# The editable install points at this checkout's sdk/python; a venv made from
# another checkout (a CI clone elsewhere) is re-pointed here, cheaply.
if ! "$venv/bin/python" -c 'import os, sys, pandastack; here = os.path.realpath("sdk/python/src"); sys.exit(0 if os.path.realpath(pandastack.__file__).startswith(here) else 1)' 2>/dev/null; then
	echo "==> pointing the SDK test venv at $(pwd)/sdk/python" >&2
	"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -e "sdk/python"
fi

# A path among the arguments (sdk/python/tests/integrations, a file, a
# file::test) narrows the run to it; without one the whole suite runs.
targets=(sdk/python/tests)
for a in "$@"; do
	case "$a" in
	-*) ;;
	*) if [ -e "${a%%::*}" ]; then targets=(); break; fi ;;
	esac
done
echo "==> python -m pytest ${targets[*]} $*" >&2
set +e
# The tests' temp dirs (tmp_path) in one of this run's own, removed after
# it, rather than in pytest's per-user dir under /tmp, which keeps the last
# three runs'.
base=$(mktemp -d -t pandastack-pytest.XXXXXX)
trap 'rm -rf "$base"' EXIT
"$venv/bin/python" -m pytest "${targets[@]}" -q --basetemp="$base" "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
	echo "pytest collected no tests: that is a failure here" >&2
	exit 1
fi
exit "$rc"
