#!/usr/bin/env bash
# The key of an hpcbus build (deploy/dist.sh keeps the wheels it built under it): a hash of every file a
# wheel is built from (the package through its folders, pyproject.toml, setup.py, README.md) and of the
# arguments, which name what else the build depends on (target, Python, compiler). What a build leaves in
# the tree (compiled extensions, bytecode) is not part of it.
#   deploy/build-key.sh ROOT [WORD...]
set -euo pipefail
root=$1; shift
{
  printf '%s\n' "$@"
  cd "$root"
  find -L hpcbus -type f ! -name '*.so' ! -name '*.pyc' ! -path '*/__pycache__/*' -print0 \
    | LC_ALL=C sort -z | xargs -0 sha256sum
  sha256sum pyproject.toml setup.py README.md
} | sha256sum | cut -c1-32
