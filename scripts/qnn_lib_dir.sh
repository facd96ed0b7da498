#!/usr/bin/env bash
# Prints the directory holding libQnnHtp.so / libQnnSystem.so from the project venv
# (the value the runtime reads from VLA_QNN_LIB_DIR).
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="$repo_root/.venv/bin/python"
if [[ ! -x "$py" ]]; then
    echo "qnn_lib_dir: $repo_root/.venv missing; run scripts/setup_python.sh first" >&2
    exit 1
fi
"$py" - <<'PY'
import os, sys
import importlib.util
spec = importlib.util.find_spec("onnxruntime_qnn")
if spec is None or not spec.submodule_search_locations:
    sys.exit("qnn_lib_dir: package onnxruntime_qnn not installed in the venv")
d = os.path.realpath(list(spec.submodule_search_locations)[0])
if not os.path.isfile(os.path.join(d, "libQnnHtp.so")):
    sys.exit(f"qnn_lib_dir: {d}/libQnnHtp.so not found")
print(d)
PY
