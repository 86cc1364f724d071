#!/usr/bin/env bash
# Installs the Debian packages hpcbus's tests and `make run` use, only those missing. Idempotent.
# Services are NOT started or enabled here: tests and `make run` start private instances in temp dirs.
set -euo pipefail
PKGS=(influxdb victoria-metrics slurmctld slurmd slurmdbd slurm-client munge mariadb-server hwloc
      slurm-wlm-influxdb-plugin chromium
      systemd curl   # systemd-analyze verify, systemd-sysusers (tests/test_units.py; no init needed), curl (docs/deploy.md)
      gcc python3-dev)  # `pip install` compiles hpcbus's optional C extension (setup.py; without: pure path)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && { echo "debian packages: all present"; exit 0; }
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "debian packages: installing ${missing[*]}"
# Keep package scripts from starting system-wide daemons (no init system in containers anyway).
policy=/usr/sbin/policy-rc.d; made_policy=0
if [ ! -e "$policy" ]; then printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null; $SUDO chmod +x "$policy"; made_policy=1; fi
trap '[ $made_policy -eq 1 ] && $SUDO rm -f "$policy"' EXIT
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "debian packages: done"
