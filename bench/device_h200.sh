#!/usr/bin/env bash
# The one prepared run on a lent CUDA machine (no registry there): the memory calibration
# (bench/memory_cuda.py) then the time checks (bench/time_cuda.py). Missing packages travel as
# wheels in .whl/ (pydantic, pydantic-core, annotated-types, typing-inspection, typing-extensions for
# the machine's Python); the package itself runs from src/. Writes bench/results/*_<gpu>.json.
# Usage: bench/device_h200.sh [gpu]     (about 6 minutes on one H200)
set -uo pipefail
cd "$(dirname "$0")/.."
GPU=${1:-h200}
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD/src:${PYTHONPATH:-} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,clocks.max.mem,memory.total,driver_version --format=csv
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
timeout 270 python3 bench/memory_cuda.py --gpu "$GPU"
echo "memory_cuda exit $?"
timeout 240 python3 bench/time_cuda.py --gpu "$GPU"
echo "time_cuda exit $?"
