#!/usr/bin/env bash
# Creates the project-local venv (<repo>/.venv) with the pinned Python tooling and the
# repository's packages (tools/, editable), and prints
# the QNN library dir (the onnxruntime_qnn package dir) for VLA_QNN_LIB_DIR.
# Idempotent: a venv whose installed pins already match requirements.txt is left alone.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=setup_lib.sh
source "$repo_root/scripts/setup_lib.sh"
venv="$repo_root/.venv"
requirements="$repo_root/scripts/requirements.txt"
stamp="$venv/.requirements.sha256"
python="${PYTHON:-python3}"

want="$(sha256sum "$requirements" | cut -d' ' -f1)"
if [[ ! -x "$venv/bin/python" ]]; then
    "$python" -m venv "$venv"
fi
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
        -r "$requirements" >&2
    echo "$want" > "$stamp"
fi
# The repository's packages: vla-import, vla-fleet (its tests drive the rollout from here),
# goldens, and the host library they share.
editable_packages setup_python "$venv" "$repo_root/tools/vla_host" "$repo_root/tools/vla_import" \
    "$repo_root/tools/vla_fleet" "$repo_root/tools/goldens"
"$repo_root/scripts/qnn_lib_dir.sh"
