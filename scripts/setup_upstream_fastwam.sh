#!/usr/bin/env bash
# Creates build/fastwam-venv for tools/goldens/vla_goldens/upstream_fastwam.py: the packages the imported
# upstream Fast-WAM modules need (normalizer.py, fastwam_processor.py, action_state_merger.py,
# experiments/libero/eval_libero_single.py, libero_utils.py, transforms/image.py), pinned.
# Separate from the project .venv and not used by CI.
#
# torch is large (the PyPI wheel pulls ~4 GB of CUDA libraries just to import): pass an
# existing venv that has torch==2.11.0 torchvision==0.26.0 numpy==2.2.6 pillow==12.0.0 as
# TORCH_VENV=DIR (e.g. the one scripts/setup_upstream.sh builds) and its site-packages are
# layered under this venv by a .pth file; without it they are installed here.
#
# Upstream's pyproject pins pillow==12.0.0 (kept: the resize is the point), numpy 1.26.4 and
# torch 2.7.1 (we run numpy 2.2.6 / torch 2.11.0: the functions used are f32 elementwise
# arithmetic, clamp, permute). Not installed (the called functions do not use them; the
# script stubs these imports and says so): libero (robosuite/MuJoCo), and the LeRobot
# dataset stack behind robot_video_dataset.py (datasets, pyarrow, av, torchcodec).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=setup_lib.sh
source "$ROOT/scripts/setup_lib.sh"
VENV="${FASTWAM_VENV:-$ROOT/build/fastwam-venv}"
PY="${PYTHON:-python3.11}"

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/pip"
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
if [ -n "${TORCH_VENV:-}" ]; then
    TSITE="$("$TORCH_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    echo "$TSITE" > "$SITE/torch-venv.pth"
    "$VENV/bin/python" -c "import torch, torchvision, numpy, PIL; assert (torch.__version__.split('+')[0], torchvision.__version__.split('+')[0], numpy.__version__, PIL.__version__) == ('2.11.0', '0.26.0', '2.2.6', '12.0.0'), (torch.__version__, torchvision.__version__, numpy.__version__, PIL.__version__)"
else
    "$PIP" install --only-binary=:all: --index-url https://download.pytorch.org/whl/cpu \
        torch==2.11.0 torchvision==0.26.0
    "$PIP" install --only-binary=:all: numpy==2.2.6 pillow==12.0.0
fi
# omegaconf 2.3.0 / hydra-core 1.3.2 need antlr4 4.9.3, published only as a (pure-Python) sdist.
"$PIP" install --no-deps antlr4-python3-runtime==4.9.3
# Pure-Python imports of the eval/normalizer modules, upstream's pins where it has them.
"$PIP" install --no-deps --only-binary=:all: \
    omegaconf==2.3.0 hydra-core==1.3.2 PyYAML==6.0.4 \
    GitPython==3.1.45 gitdb==4.0.12 smmap==5.0.2 \
    accelerate==1.12.0 psutil==7.1.3 huggingface_hub==1.6.0 safetensors==0.8.0 packaging==26.4 \
    imageio==2.37.0 rich==14.2.0 markdown-it-py==4.3.0 mdurl==0.1.2 Pygments==2.21.0 \
    tqdm==4.66.5 typing_extensions==4.16.0 filelock==4.3.1 fsspec==2026.9.0
# Not installed: ftfy. Upstream's pyproject does not pin it, and without it Wan's `basic_clean`
# skips `ftfy.fix_text` (wan_video_text_encoder.py falls back to the identity): the goldens of
# tools/goldens/vla_goldens/export_upstream_fastwam.py are made that way, as upstream's pinned environment runs.
"$VENV/bin/python" -c "import torch, omegaconf, hydra, git, accelerate, imageio; print('fastwam upstream venv ready:', torch.__version__)"
# The golden generators (tools/goldens) and the host library they use.
editable_packages setup_upstream_fastwam "$VENV" "$ROOT/tools/vla_host" "$ROOT/tools/goldens"
