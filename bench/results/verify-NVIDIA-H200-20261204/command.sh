printf '#!/bin/sh\nexec python3 -m trainledger "$@"\n' > /tmp/tl; chmod +x /tmp/tl
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD/src:/tmp/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRAINLEDGER_LEDGER=$OUT/ledger.db
run() { n=$1; shift; echo "== $n: $*"; timeout 70 /tmp/tl "$@" --json > $OUT/$n.json 2> $OUT/$n.log; echo "exit $?"; tail -3 $OUT/$n.log; }
run probe verify probe --require-gpu
run memory-1b verify memory --model llama-3.2-1b --seq-len 2048 --micro-batch 2 --precision bf16-mixed --device cuda
run accept-tiny verify accept --model tiny-llama-debug --precision bf16-mixed --gpus 1 --nproc 1 --device cuda
run accept-1b verify accept --model llama-3.2-1b --precision bf16-mixed --seq-len 2048 --gpus 1 --nproc 1 --device cuda
