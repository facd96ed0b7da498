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
# shellcheck source=setup_lib.sh
source "$ROOT/scripts/setup_lib.sh"
VENV="${FLEET_VENV:-$ROOT/build/fleet-venv}"
PY="${PYTHON:-python3.11}"
REQ="$ROOT/scripts/fleet-requirements.txt"

apt_packages=(libcairo2-dev libgirepository1.0-dev pkg-config gcc libc6-dev dbus-daemon squashfs-tools openssl)
apt_ensure setup_fleet "${apt_packages[@]}"

venv_from_hashes setup_fleet "$VENV" "$REQ" "$PY"
editable_packages setup_fleet "$VENV" "$ROOT/tools/vla_fleet"
