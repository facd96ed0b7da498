#!/usr/bin/env bash
# Creates build/fleet-venv, the fleet rollout's own venv (tools/vla_fleet): the hawkBit-DDI
# server goosebit and the RAUC project's DDI client rauc-hawkbit, from the pinned, hashed
# scripts/fleet-requirements.txt; plus the Debian packages they and the device stand-ins
# need (the client's PyGObject/pycairo build, a private D-Bus for it, squashfs-tools and
# openssl for RAUC bundles). RAUC 1.13 itself comes from scripts/rauc/check.sh's build
# (build/tools). Idempotent: a venv whose stamp matches the requirements file is kept.
# Separate from the project .venv: nothing of it in CI's other steps.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${FLEET_VENV:-$ROOT/build/fleet-venv}"
PY="${PYTHON:-python3.11}"
REQ="$ROOT/scripts/fleet-requirements.txt"

apt_packages=(libcairo2-dev libgirepository1.0-dev pkg-config gcc libc6-dev dbus-daemon squashfs-tools openssl)
missing=()
for p in "${apt_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "setup_fleet: installing Debian packages: ${missing[*]}"
    sudo_cmd=()
    [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
    "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

stamp="$VENV/.requirements.sha256"
want="$(sha256sum "$REQ" | cut -d' ' -f1)"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
    echo "setup_fleet: venv $VENV from $REQ"
    [[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check --require-hashes --no-deps -r "$REQ"
    echo "$want" >"$stamp"
fi
