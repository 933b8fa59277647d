# Sourced by the test scripts: puts Node.js 20 or newer (the TypeScript
# SDK's floor) and its npm first on PATH. A Node on PATH that is new enough
# is used as it is. Otherwise, as root, npm fetches Node itself from the npm
# registry this machine is configured with (the `node` package ships its
# binary; Debian's nodejs and npm, older, bootstrap it when there is no npm
# at all), once, into the cache keyed by the major version. Returns non-zero
# with a message when no such Node can be had.
NODE_MAJOR=${PANDASTACK_NODE_MAJOR:-20}
NODE_DIR="${PANDASTACK_CACHE_DIR:-/var/cache/pandastack}/node/$NODE_MAJOR"
node_ok() {
  command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 &&
    [ "$(node -p 'process.versions.node.split(".")[0]')" -ge "$NODE_MAJOR" ]
}
node_env() {
  if [ -x "$NODE_DIR/node_modules/.bin/node" ]; then
    PATH="$NODE_DIR/node_modules/.bin:$PATH"
  fi
  node_ok && return 0
  if [ "$(id -u)" -ne 0 ]; then
    echo "Node.js $NODE_MAJOR or newer, with npm, is needed for the TypeScript SDK tests; run as root to have it fetched, or install it" >&2
    return 1
  fi
  if ! command -v npm >/dev/null 2>&1; then
    printf '\n==> %s\n' "apt-get install nodejs npm (to bootstrap Node.js $NODE_MAJOR)" >&2
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends nodejs npm
    node_ok && return 0
  fi
  printf '\n==> %s\n' "fetching Node.js $NODE_MAJOR and npm from the npm registry (once; cached in $NODE_DIR)" >&2
  mkdir -p "$(dirname "$NODE_DIR")"
  local tmp
  tmp=$(mktemp -d "$(dirname "$NODE_DIR")/.tmp.XXXXXX")
  # A run cut short leaves only the temp dir; the cache entry appears whole.
  if ! npm install --prefix "$tmp" --no-audit --no-fund --no-save "node@$NODE_MAJOR" "npm@10" >&2; then
    rm -rf "$tmp"
    echo "could not fetch Node.js $NODE_MAJOR from the npm registry" >&2
    return 1
  fi
  rm -rf "$NODE_DIR" && mv "$tmp" "$NODE_DIR"
  PATH="$NODE_DIR/node_modules/.bin:$PATH"
  hash -r
  if ! node_ok; then
    echo "Node.js fetched into $NODE_DIR does not run as Node $NODE_MAJOR or newer" >&2
    return 1
  fi
}
node_env
