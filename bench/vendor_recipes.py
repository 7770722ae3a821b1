"""Current vendor tables (issue 15 item 5): what the MXFP8 / NVFP4 recipes, MoE parallel folding
and the gpt-oss presets come to. Prints

* gpt-oss parameter counts next to OpenAI's model card (arXiv:2508.10925, Table 1);
* one Llama-3.1-8B pretraining step on 8 B200s under Megatron-Core in bf16-mixed, fp8-mixed,
  mxfp8-mixed and nvfp4-mixed: peak memory, the quantized weight copies, step time, matmul time;
* Qwen3-30B-A3B on 16 B200s under Megatron-Core with tp 4: ep 4 (within dp) against ep 8 / etp 1
  (folded): weights, optimizer states, step time, EP all-to-all time.

Usage: PYTHONPATH=src python bench/vendor_recipes.py
"""

from __future__ import annotations

from trainledger.estimate import estimate
from trainledger.load.hf import load_model
from trainledger.load.plan import PlanInputs, build_plan

GIB = 2**30
CARD = {"gpt-oss-20b": (20.91, 3.61), "gpt-oss-120b": (116.83, 5.13)}


def main() -> None:
    print("gpt-oss parameters (B): ours vs model card (total, active without the embedding)")
    for name, (tot, act) in CARD.items():
        p = load_model(name).params
        print(f"  {name:13s} total {p.total / 1e9:7.2f} (card {tot:6.2f})   "
              f"active {(p.active - p.breakdown['embedding']) / 1e9:5.2f} (card {act:4.2f})")

    print("\nLlama-3.1-8B pretrain, 8x B200, megatron-core, ZeRO-1, s=4096")
    print(f"  {'precision':12s} {'peak GiB':>9s} {'copies GiB':>10s} {'step ms':>8s} {'matmul ms':>9s}  matmul dtype")
    for prec in ("bf16-mixed", "fp8-mixed", "mxfp8-mixed", "nvfp4-mixed"):
        plan = build_plan(PlanInputs(model="llama-3.1-8b", gpu="b200", gpus=8, method="pretrain",
                                     framework="megatron-core", zero=1, precision=prec))
        e = estimate(plan)
        mem = e.memory
        copies = next((t.value for t in mem.terms if t.name == "autocast_weight_copies"), 0.0)
        c = e.compute
        print(f"  {prec:12s} {mem.peak_allocated_bytes / GIB:9.2f} "
              f"{copies / GIB:10.2f} {c.step_time_s * 1e3:8.1f} {c.compute_parts['matmul'] * 1e3:9.1f}  {c.matmul_dtype}")

    print("\nQwen3-30B-A3B pretrain, 16x B200 (2 nodes), megatron-core, tp 4, ZeRO-1")
    for label, kw in (("ep 4 (within dp 4)", dict(ep=4)), ("ep 8, etp 1 (folded)", dict(ep=8, etp=1))):
        plan = build_plan(PlanInputs(model="qwen3-30b-a3b", gpu="b200", gpus=16, method="pretrain",
                                     framework="megatron-core", zero=1, tp=4, **kw))
        e = estimate(plan)
        bd = e.compute.breakdown
        print(f"  {label:22s} peak {e.memory.peak_allocated_bytes / GIB:6.2f} GiB, step "
              f"{e.compute.step_time_s * 1e3:7.1f} ms, comm_ep {bd.get('comm_ep', 0.0) * 1e3:6.1f} ms")


if __name__ == "__main__":
    main()
