#!/usr/bin/env bash
# Creates build/upstream-venv: the pinned upstream MolmoAct2 code (PyPI wheel lerobot==0.6.1) and
# only what its imported modules need, for tools/goldens/vla_goldens/upstream_molmoact2.py. Separate from the
# project .venv and not used by CI (torch's PyPI wheel pulls ~4 GB of CUDA libraries that the
# wheel needs just to import, even on CPU).
#
# lerobot 0.6.1 declares Python >= 3.12; this machine has CPython 3.11, so the wheel is fetched
# with --python-version 3.12 and installed --no-deps --ignore-requires-python. Only the vendored
# HF modules (molmoact2_hf_model/) and processor_molmoact2.py are imported, straight from their
# files (the lerobot package __init__ chain reaches lerobot/utils/io_utils.py, whose PEP 695
# syntax 3.11 cannot compile).
#
# KeyStone is not on PyPI: pass a checkout of github dywsjtu/keystone to the script
# (--keystone-src DIR); its code is never copied into this repo.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=setup_lib.sh
source "$ROOT/scripts/setup_lib.sh"
VENV="${UPSTREAM_VENV:-$ROOT/build/upstream-venv}"
WHEELS="$ROOT/build/upstream-wheels"
PY="${PYTHON:-python3}"

mkdir -p "$WHEELS"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/pip"

"$PIP" download --no-deps --python-version 3.12 --only-binary=:all: -d "$WHEELS" lerobot==0.6.1
cat > "$WHEELS/requirements.txt" <<'REQ'
torch==2.11.0
torchvision==0.26.0
annotated-doc==0.0.7
annotated-types==0.8.0
anyio==4.16.0
certifi==2026.10.19.post1
charset-normalizer==3.5.3
cuda-bindings==13.0.3
cuda-pathfinder==1.9.1
cuda-toolkit[cublas,cudart,cufft,cufile,cupti,curand,cusolver,cusparse,nvjitlink,nvrtc,nvtx]==13.0.2
einops==0.8.1
filelock==4.3.1
fsspec==2026.9.0
h11==0.16.0
hf-xet==1.8.0
httpcore==1.0.9
httpx==0.28.1
huggingface_hub==1.6.0
idna==3.20
Jinja2==3.1.6
markdown-it-py==4.3.0
MarkupSafe==3.0.4
mdurl==0.1.2
mpmath==1.3.0
networkx==3.6.1
numpy==2.2.6
nvidia-cublas==13.1.0.3
nvidia-cuda-cupti==13.0.85
nvidia-cuda-nvrtc==13.0.88
nvidia-cuda-runtime==13.0.96
nvidia-cudnn-cu13==9.19.0.56
nvidia-cufft==12.0.0.61
nvidia-cufile==1.15.1.6
nvidia-curand==10.4.0.35
nvidia-cusolver==12.0.4.66
nvidia-cusparse==12.6.3.3
nvidia-cusparselt-cu13==0.8.0
nvidia-nccl-cu13==2.28.9
nvidia-nvjitlink==13.0.88
nvidia-nvshmem-cu13==3.4.5
nvidia-nvtx==13.0.85
onnx==1.23.2
ml_dtypes==0.6.0
protobuf==7.36.2
packaging==26.4
pillow==12.0.0
pydantic==2.14.4
pydantic_core==2.50.5
Pygments==2.21.0
PyYAML==6.0.4
regex==2026.11.19
requests==2.32.5
rich==15.0.0
safetensors==0.8.0
shellingham==1.5.4
sympy==1.14.0
tokenizers==0.22.2
tqdm==4.70.1
transformers==5.5.4
typer==0.29.2
typing-inspection==0.4.5
typing_extensions==4.16.0
urllib3==2.8.0
REQ
"$PIP" install --no-deps --only-binary=:all: -r "$WHEELS/requirements.txt"
"$PIP" install --no-deps --ignore-requires-python "$WHEELS/lerobot-0.6.1-py3-none-any.whl"
"$VENV/bin/python" -c "import torch, transformers; print('upstream venv ready:', torch.__version__, transformers.__version__)"
# The golden generators (tools/goldens) and the host library they use.
editable_packages setup_upstream "$VENV" "$ROOT/tools/vla_host" "$ROOT/tools/goldens"
