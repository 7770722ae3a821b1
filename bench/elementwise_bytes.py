"""HBM bytes of the streaming (non-GEMM, non-attention) kernels of one Hugging Face training step,
counted from the ops torch dispatches, beside what the time model charges for them (issue 15).

The step runs on fake tensors (verify's StepRunner, CUDA's autocast lists) under
``trainledger.verify.opbytes.OpBytes``, which takes each op's reads (its tensor arguments) and
writes (mutated arguments, fresh outputs) from its schema; views move nothing. Ops are grouped by the time model's terms: matmul, attention,
loss (log-softmax, NLL), embedding, optimizer (the optimizer phase), and the rest, elementwise.
Where ``bench/results/time_cuda_h200_profile.json`` holds the same configuration measured on an
H200, the elementwise kernels' measured milliseconds give the bandwidth they reached.

Usage: python bench/elementwise_bytes.py [--model llama-3.2-1b] [--seq-len 2048] [--micro-batch 4]
       [--precision bf16-mixed] [--by-op]     (no arguments: the H200 profile's configurations)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

def count_step(kw: dict[str, Any]) -> dict[str, Any]:
    """Bytes by term and by elementwise op of one steady-state training step of ``kw``'s plan."""
    import contextlib

    from trainledger.load.hf import load_hf_config
    from trainledger.load.plan import PlanInputs, build_plan
    from trainledger.verify.build import build_model, fake_runtime
    from trainledger.verify.opbytes import OpBytes
    from trainledger.verify.train_step import StepRunner

    plan = build_plan(PlanInputs(framework="hf", **kw))
    built = build_model(load_hf_config(plan.model.name), plan.recipe, device="fake", seed=0)
    counter = OpBytes()

    @contextlib.contextmanager
    def phase(name: str):
        counter.phase = name
        yield

    with fake_runtime(built.fake_mode):
        runner = StepRunner(built, plan.recipe, seed=0)
        runner.step()
        with counter:
            runner.step(phase)
    return {"plan": plan, "terms": counter.terms,
            "ops": dict(sorted(counter.by_op.items(), key=lambda kv: -kv[1]))}


def model_elementwise_bytes(plan: Any) -> float:
    """Bytes the time model's elementwise term streams for the plan (its seconds at its bandwidth)."""
    from trainledger.estimate.time import estimate_compute
    from trainledger.estimate.time.efficiency import for_gpu

    comp = estimate_compute(plan)
    gpu = plan.cluster.gpu
    return comp.compute_parts["elementwise"] * gpu.hbm_bytes_per_s * for_gpu(gpu).hbm


def main(argv: list[str]) -> int:
    def arg(name: str, default: str) -> str:
        return argv[argv.index(name) + 1] if name in argv else default

    measured = {}
    prof = ROOT / "bench" / "results" / "time_cuda_h200_profile.json"
    if prof.exists():
        for row in json.loads(prof.read_text())["step"]:
            if "profile" in row:
                measured[json.dumps(row["inputs"], sort_keys=True)] = row["profile"]["kernel_ms_by_term"]
    if "--model" in argv:
        cases = [dict(model=arg("--model", "llama-3.2-1b"), seq_len=int(arg("--seq-len", "2048")),
                      micro_batch=int(arg("--micro-batch", "1")), precision=arg("--precision", "bf16-mixed"))]
    else:
        sys.path.insert(0, str(ROOT / "bench"))
        from time_cuda import STEPS

        cases = [kw for _, kw in STEPS]
    print(f"{'configuration':58s} {'counted GB':>10s} {'model GB':>9s} {'meas ms':>8s} {'TB/s':>6s}  by term (GB)")
    for kw in cases:
        c = count_step({"gpu": "h200", **kw})
        ew = c["terms"].get("elementwise", 0.0)
        ms = measured.get(json.dumps(kw, sort_keys=True), {}).get("elementwise")
        bw = f"{ew / (ms / 1e3) / 1e12:6.2f}" if ms else "     -"
        label = " ".join(f"{k}={v}" for k, v in kw.items())
        print(f"{label:58s} {ew / 1e9:10.1f} {model_elementwise_bytes(c['plan']) / 1e9:9.1f} "
              f"{ms if ms else float('nan'):8.1f} {bw}  "
              + " ".join(f"{k} {v / 1e9:.1f}" for k, v in sorted(c["terms"].items())), flush=True)
        if "--by-op" in argv:
            for op, b in list(c["ops"].items())[:25]:
                print(f"    {b / 1e9:8.2f} GB  {op}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
