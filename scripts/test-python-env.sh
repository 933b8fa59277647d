#!/usr/bin/env bash
# Creates (once) a Python venv with a Jupyter kernel stack for the tests of
# internal/agent/jupyter and prints the path of its python3. The venv lives in
# ${PANDASTACK_CACHE_DIR:-/var/cache/pandastack}/pyenv/kernel-<hash>, keyed by
# the pinned requirements and the base interpreter, so a change of either
# makes a new one. Usage: export PANDASTACK_TEST_PYTHON=$(scripts/test-python-env.sh)
set -euo pipefail

# The system python by default: unlike one under /root (pyenv), other users
# can run it, which the tests of kernels run as another user need.
if [ -z "${PYTHON:-}" ]; then
	PYTHON=python3
	if /usr/bin/python3 -c 'import venv, ensurepip' 2>/dev/null; then
		PYTHON=/usr/bin/python3
	fi
fi
REQUIREMENTS='ipykernel==7.4.0
matplotlib==3.11.2
pandas==3.1.1'

CACHE=${PANDASTACK_CACHE_DIR:-/var/cache/pandastack}
base_version=$("$PYTHON" -c 'import sys; print(sys.executable, sys.version)')
hash=$(printf '%s\n%s\n' "$REQUIREMENTS" "$base_version" | sha256sum | cut -c1-12)
dir="$CACHE/pyenv/kernel-$hash"

if [ ! -f "$dir/.complete" ]; then
	echo "==> creating the kernel test venv in $dir" >&2
	# A venv cannot be moved once made, so it is built in place and marked
	# complete last; an interrupted build is started over.
	rm -rf "$dir"
	mkdir -p "$CACHE/pyenv"
	"$PYTHON" -m venv "$dir" >&2
	"$dir/bin/python3" -m pip install --quiet --disable-pip-version-check \
		-r /dev/stdin >&2 <<<"$REQUIREMENTS"
	"$dir/bin/python3" -c 'import ipykernel, matplotlib, pandas' >&2
	# Readable by all whatever root's umask: a test runs kernels as another user.
	chmod -R a+rX "$dir"
	touch "$dir/.complete"
fi
echo "$dir/bin/python3"
