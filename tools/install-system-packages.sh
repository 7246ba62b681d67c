#!/usr/bin/env bash
# Install the Debian packages listed in tools/system-packages.txt that are missing.
# Idempotent: a second call with everything present returns at once.
# As non-root it prints the exact command to run and exits 1.
set -euo pipefail
list="$(dirname "$0")/system-packages.txt"
mapfile -t wanted < <(grep -v '^\s*#' "$list" | grep -v '^\s*$')
missing=()
for pkg in "${wanted[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$pkg")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0
cmd="apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y ${missing[*]}"
if [[ $(id -u) -ne 0 ]]; then
  echo "hpcmem: missing system packages: ${missing[*]}" >&2
  echo "Run as root:  $cmd" >&2
  exit 1
fi
echo "hpcmem: installing system packages: ${missing[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
