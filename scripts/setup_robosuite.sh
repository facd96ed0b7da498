#!/usr/bin/env bash
# Creates build/robosuite-venv for tools/goldens/vla_goldens/robosuite_quat_goldens.py: robosuite 1.4.0 (the
# version LIBERO pins) with its runtime dependencies, pinned, so that the goldens come from
# `robosuite.utils.transform_utils.quat2axisangle` imported the ordinary way (the package's
# __init__ imports MuJoCo and numba, hence the full install; termcolor is imported by its
# log_utils but missing from its declared requirements). Separate from the project
# .venv; not used by CI (CI reads the committed golden/robosuite/quat2axisangle.npz).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=setup_lib.sh
source "$ROOT/scripts/setup_lib.sh"
VENV="${ROBOSUITE_VENV:-$ROOT/build/robosuite-venv}"
PY="${PYTHON:-python3.11}"

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/pip" install --only-binary=:all: \
    robosuite==1.4.0 numpy==1.26.4 numba==0.59.1 llvmlite==0.42.0 scipy==1.11.4 \
    mujoco==3.1.6 pillow==10.4.0 opencv-python==4.9.0.80 termcolor==2.4.0
"$VENV/bin/python" -c "import robosuite, numpy; assert robosuite.__version__ == '1.4.0', robosuite.__version__; print('robosuite', robosuite.__version__, 'numpy', numpy.__version__)"
# The golden generators (tools/goldens) and the host library they use.
editable_packages setup_robosuite "$VENV" "$ROOT/tools/vla_host" "$ROOT/tools/goldens"
