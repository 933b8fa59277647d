#!/usr/bin/env bash
# Installs what PandaStack needs on a Debian/Ubuntu host and builds it.
# Idempotent: a second run only rebuilds the Go binaries. Heavy artifacts
# (the runsc build, template root filesystems) go to the cache directory,
# keyed by version, outside the repository.
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE=${PANDASTACK_CACHE_DIR:-/var/cache/pandastack}
# The go command keeps its caches under HOME (a systemd unit may set none).
if [ -z "${HOME:-}" ]; then
  HOME=$(getent passwd "$(id -u)" | cut -d: -f6)
  export HOME
fi
RUNSC_VERSION=$(sed -n 's/^const RunscVersion = "\(.*\)"$/\1/p' internal/paths/paths.go)
RUNSC_BUILD=$(sed -n 's/^const RunscBuild = "\(.*\)"$/\1/p' internal/paths/paths.go)
VERSITYGW_VERSION=$(sed -n 's/^const VersityGWVersion = "\(.*\)"$/\1/p' internal/testutil/s3.go)
# The newest go line of the modules setup builds: runsc's build module
# follows gVisor's, which may be ahead of ours.
GO_WANT=$(sed -n 's/^go \([0-9.]*\)$/\1/p' go.mod scripts/runsc-precompiled/go.mod | sort -V | tail -1)
step() { printf '\n==> %s\n' "$*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
  echo "setup needs root (apt-get, runsc, debootstrap): run it with sudo" >&2
  exit 1
fi

# Debian packages: debootstrap builds template root filesystems; busybox-static
# gives the runtime tests a tiny root filesystem; nftables (the nft tool) lets
# tests and operators inspect the sandbox firewall; postgresql-15's server
# binaries run the throwaway clusters of the PostgreSQL store's tests (the
# tests start their own; no system cluster is made); chromium runs the browser
# tests of the web console (scripts/test-browser.sh); gcc and libc6-dev the
# race detector's cgo (scripts/test.sh); git and curl for the rest.
missing=()
for p in debootstrap busybox-static ca-certificates chromium curl gcc git libc6-dev nftables python3 python3-venv postgresql-15; do
  # Installed, not merely known (a package removed but not purged is).
  [ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null)" = installed ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  step "apt-get install ${missing[*]}"
  if [[ " ${missing[*]} " == *" postgresql-15 "* ]] && [ ! -e /etc/postgresql-common/createcluster.conf ]; then
    # Keep the package from creating and starting a cluster of its own.
    mkdir -p /etc/postgresql-common
    echo 'create_main_cluster = false' > /etc/postgresql-common/createcluster.conf
  fi
  apt-get update -q
  # confold: dpkg keeps that file instead of asking about it.
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "${missing[@]}"
fi

# Go: use the one on PATH when it is new enough. Otherwise go fetches the
# toolchain go.mod wants itself (GOTOOLCHAIN, Go 1.21 and later) through the
# module proxy it is configured with (`go env GOPROXY`). With no Go at all,
# Debian's golang-go serves to bootstrap; one older than 1.21 cannot switch
# toolchains, so the same toolchain module is fetched from that proxy here.
# (GOTOOLCHAIN=local: asked in this module, a Go of 1.21 or later would
# otherwise fetch the toolchain go.mod names and answer for it.)
go_ok() { command -v go >/dev/null 2>&1 && [ "$(printf '%s\n' "$GO_WANT" "$(GOTOOLCHAIN=local go env GOVERSION | sed 's/^go//')" | sort -V | head -1)" = "$GO_WANT" ]; }
if ! go_ok; then
  if ! command -v go >/dev/null 2>&1; then
    step "apt-get install golang-go (to bootstrap the Go toolchain $GO_WANT)"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends golang-go
  fi
  GOV=go$GO_WANT
  HAVE=$(GOTOOLCHAIN=local go env GOVERSION | sed 's/^go//')
  if [ "$(printf '%s\n' 1.21 "$HAVE" | sort -V | head -1)" = 1.21 ]; then
    step "fetching the Go toolchain $GOV through GOTOOLCHAIN"
    GODIR=$(GOTOOLCHAIN=$GOV go env GOROOT)
  else
    GODIR="$CACHE/go/$GOV"
    if [ ! -x "$GODIR/bin/go" ]; then
      PROXY=$(go env GOPROXY | tr ',|' '\n\n' | grep -v -x -e direct -e off | head -1)
      if [ -z "$PROXY" ]; then
        echo "go $HAVE is too old to fetch go $GO_WANT itself, and GOPROXY ($(go env GOPROXY)) names no proxy to fetch it from: install go $GO_WANT" >&2
        exit 1
      fi
      step "fetching the Go toolchain $GOV from the module proxy $PROXY"
      ZIP="golang.org/toolchain@v0.0.1-$GOV.linux-$(go env GOARCH)"
      tmp=$(mktemp -d)
      curl -fsSL "${PROXY%/}/golang.org/toolchain/@v/v0.0.1-$GOV.linux-$(go env GOARCH).zip" -o "$tmp/go.zip"
      (cd "$tmp" && python3 -m zipfile -e go.zip .)
      mkdir -p "$CACHE/go"
      rm -rf "$GODIR" && mv "$tmp/$ZIP" "$GODIR"
      chmod +x "$GODIR"/bin/* "$GODIR"/pkg/tool/*/*
      rm -rf "$tmp"
    fi
  fi
  export PATH="$GODIR/bin:$PATH"
fi
export GOTOOLCHAIN=local
# test.sh uses the Go chosen here (written whole, then moved into place).
mkdir -p "$CACHE/go"
go env GOROOT > "$CACHE/go/.selected.$$" && mv "$CACHE/go/.selected.$$" "$CACHE/go/selected"

# go_install_cached PKG@VERSION DEST WHAT: builds a Go program from the Go
# module proxy into DEST (in the cache), once.
go_install_cached() {
  local dest=$2
  [ -x "$dest" ] && return 0
  step "building $3 (once; cached in $(dirname "$dest"))"
  mkdir -p "$(dirname "$dest")"
  local tmpbin
  tmpbin=$(mktemp -d)
  GOBIN="$tmpbin" CGO_ENABLED=0 go install "$1"
  mv "$tmpbin/$(basename "${1%@*}")" "$dest"
  rmdir "$tmpbin"
}

# gVisor's runsc at the pinned version (Debian's runsc package is years
# old), with its seccomp filters precompiled: the module proxy's source
# ships them empty, and a runsc without them compiles its filters at every
# start (0.1-0.2 s of CPU in each create, restore and fork). Built from a
# writable copy of the module source into which scripts/runsc-precompiled
# writes the programs, after small patches (docs/architecture.md,
# "Security model"). Cached by RunscVersion and RunscBuild; once, about 5
# minutes or more.
build_runsc() {
  local dest=$1 gen=scripts/runsc-precompiled
  [ -x "$dest" ] && return 0
  if ! grep -q "gvisor.dev/gvisor $RUNSC_VERSION\$" "$gen/go.mod"; then
    echo "$gen/go.mod does not require gvisor.dev/gvisor $RUNSC_VERSION (internal/paths.RunscVersion): update it with go get there" >&2
    return 1
  fi
  step "building gVisor runsc $RUNSC_VERSION with precompiled seccomp filters (once, 5 minutes or more; cached in $(dirname "$dest"))"
  local src tmp
  src=$(cd "$gen" && go mod download -json gvisor.dev/gvisor | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [ -d "$src" ] || { echo "go mod download gvisor.dev/gvisor@$RUNSC_VERSION gave no source directory" >&2; return 1; }
  tmp=$(mktemp -d)
  # A build interrupted (Ctrl-C, a killed CI run) leaves no copy behind.
  trap "rm -rf '$tmp'" EXIT
  cp -r "$src" "$tmp/gvisor" && chmod -R u+w "$tmp/gvisor" &&
    mkdir "$tmp/gvisor/pandastack-precompiled" && cp "$gen"/*.go "$tmp/gvisor/pandastack-precompiled/" &&
    (
      cd "$tmp/gvisor" &&
        export CGO_ENABLED=0 && # as runsc is built: cgo changes the filters' keys
        echo "  patching the source: the systrap filter's PID, the pages file's parallel reads and its copy by pwrite, the collector off during a restore's decode and paced for a checkpoint's encode (their statistics for a debug log only), the clocks' calibration, the save's scan of holes and its flush, the signal forwarding registered before the start, the boot's fd table grown ahead, Ps to spare while the tasks start, the state's statistics for a debug log only and its bytes read from the buffer" >&2 &&
        go run ./pandastack-precompiled -patch -root . &&
        echo "  precompiling the seccomp programs (gVisor computes every variant: minutes of CPU)" >&2 &&
        go run ./pandastack-precompiled -root . &&
        echo "  checking each precompiled program against runsc's run-time build of it, the patched pages reader, the encode's collector percent and the reset after a first cycle, the save's scan, the signal forwarding, the fd table's growth, the start's Ps and the state's statistics and byte reads" >&2 &&
        go test -count=1 -tags pandastack_generated ./pandastack-precompiled >&2 &&
        go test -count=1 -run Pandastack ./pkg/sentry/state/stateio ./pkg/sentry/pgalloc ./pkg/sentry/kernel ./pkg/sighandling ./pkg/pandastackfd ./pkg/state ./pkg/state/wire ./pkg/compressio >&2 &&
        echo "  building runsc" >&2 &&
        go build -o "$tmp/runsc" ./runsc
    ) || { rm -rf "$tmp"; echo "building runsc failed" >&2; return 1; }
  mkdir -p "$(dirname "$dest")"
  mv "$tmp/runsc" "$dest"
  rm -rf "$tmp"
  trap - EXIT
}
RUNSC="$CACHE/runsc/$RUNSC_VERSION-$RUNSC_BUILD/runsc"
build_runsc "$RUNSC"

# versitygw (Apache-2.0), an S3-compatible server the tests of the S3
# snapshot store run on loopback. Only the tests use it.
go_install_cached "github.com/versity/versitygw/cmd/versitygw@$VERSITYGW_VERSION" \
  "$CACHE/versitygw/$VERSITYGW_VERSION/versitygw" "versitygw $VERSITYGW_VERSION for the tests (a few minutes)"

step "building bin/pandastack and bin/pandastack-agent"
VERSION=$(git describe --always --dirty 2>/dev/null || echo dev)
CGO_ENABLED=0 go build -ldflags "-X main.version=$VERSION" -o bin/ ./cmd/pandastack ./cmd/pandastack-agent

step "templates base and code-interpreter (debootstrap, apt, pip; cached by their specs' hashes)"
PANDASTACK_CACHE_DIR="$CACHE" bin/pandastack template build base >/dev/null
PANDASTACK_CACHE_DIR="$CACHE" bin/pandastack template build code-interpreter >/dev/null

echo "setup done: runsc $RUNSC_VERSION, versitygw $VERSITYGW_VERSION, $(go version | cut -d' ' -f3), binaries in bin/" >&2
