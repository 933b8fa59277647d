#!/usr/bin/env bash
# Creates (once) a Python venv with a Jupyter kernel stack for the tests of
# internal/agent/jupyter and prints the path of its python3. The venv lives in
# ${PANDASTACK_CACHE_DIR:-/var/cache/pandastack}/pyenv/kernel-<hash>, keyed by
# the pinned requirements and the base interpreter, so a change of either
# makes a new one. Usage: export PANDASTACK_TEST_PYTHON=$(scripts/test-python-env.sh)
set -euo pipefail

PYTHON=${PYTHON:-python3}
REQUIREMENTS='ipykernel==7.4.0
matplotlib==3.11.2
pandas==3.1.1'

CACHE=${PANDASTACK_CACHE_DIR:-/var/cache/pandastack}
base_version=$("$PYTHON" -c 'import sys; print(sys.version)')
hash=$(printf '%s\n%s\n' "$REQUIREMENTS" "$base_version" | sha256sum | cut -c1-12)
dir="$CACHE/pyenv/kernel-$hash"

if [ ! -f "$dir/.complete" ]; then
	echo "==> creating the kernel test venv in $dir" >&2
	rm -rf "$dir" "$dir.tmp"
	mkdir -p "$CACHE/pyenv"
	# venvs are not relocatable: build in place under a temp name only for
	# the pip step would break shebangs, so build at the final path and mark
	# completion last.
	"$PYTHON" -m venv "$dir" >&2
	"$dir/bin/python3" -m pip install --quiet --disable-pip-version-check \
		-r /dev/stdin >&2 <<<"$REQUIREMENTS"
	"$dir/bin/python3" -c 'import ipykernel, matplotlib, pandas' >&2
	touch "$dir/.complete"
fi
echo "$dir/bin/python3"
