"""Serving accuracy: predicted output tokens/s and first-token latency vs published engine tables.

Tables (with their source URLs) live in bench/data/trtllm_static_batch.yaml: TensorRT-LLM's
published static-batch throughput at the published batch sizes (H100 FP8, A100 FP16, L40S FP8;
Llama-2 7B and 70B) and its batch-1 first-token latencies. Each row is predicted with the same
catalog knobs (nothing is fitted per row) by ``trainledger.estimate.serving.perf.ServingPerf``.
Also checks the max-concurrency accounting against vLLM's formula recomputed by hand.

Usage: PYTHONPATH=src python bench/inference_accuracy.py [--json]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import yaml

from trainledger.estimate.serving import engine_memory
from trainledger.estimate.serving.perf import ServingPerf
from trainledger.load.plan import PlanInputs, build_plan

DATA = Path(__file__).parent / "data" / "trtllm_static_batch.yaml"
MAX_DATA = Path(__file__).parent / "data" / "trtllm_max_throughput.yaml"
NIM_DATA = Path(__file__).parent / "data" / "nim_concurrency.yaml"
TARGET_MEDIAN = 0.15


def _plan(model: str, gpu: str, tp: int, precision: str, kv: str, batch: int, isl: int, osl: int):
    return build_plan(PlanInputs(model=model, gpu=gpu, gpus=tp, tp=tp, method="inference", precision=precision,
                                 seq_len=isl, generate_len=osl, micro_batch=batch, serving_engine="trtllm-0.6",
                                 kv_cache_dtype=kv))


def throughput_rows() -> list[dict]:
    data = yaml.safe_load(DATA.read_text())
    out = []
    for tab in data["tables"]:
        for model, batch, tp, isl, osl, published in tab["rows"]:
            plan = _plan(model, tab["gpu"], tp, tab["precision"], tab["kv_cache_dtype"], batch, isl, osl)
            res = ServingPerf(plan).static_batch(batch, isl, osl)
            pred = res["output_tokens_per_s_per_gpu"] if tab["per_gpu"] else res["output_tokens_per_s"]
            out.append({"table": tab["name"], "model": model, "gpu": tab["gpu"], "batch": batch, "tp": tp,
                        "isl": isl, "osl": osl, "published": published, "predicted": round(pred, 1),
                        "error": (pred - published) / published, "source": tab["source"]})
    return out


def max_load_rows() -> list[dict]:
    """Max-load throughput: the engine runs the steady-state concurrency its KV pool allows."""
    data = yaml.safe_load(MAX_DATA.read_text())
    out = []
    for grp in data["groups"]:
        for isl, osl, published in grp["rows"]:
            plan = build_plan(PlanInputs(model=grp["model"], gpu=grp["gpu"], gpus=grp["tp"], tp=grp["tp"],
                                         method="inference", precision=data["precision"], seq_len=isl,
                                         generate_len=osl, serving_engine="trtllm",
                                         kv_cache_dtype=data["kv_cache_dtype"],
                                         gpu_memory_utilization=data["gpu_memory_utilization"],
                                         max_num_seqs=data["max_batch_size"],
                                         quantization=grp.get("quantization", "none")))
            conc = max(1, engine_memory(plan).steady_concurrency(isl, osl))
            pred = ServingPerf(plan).continuous(conc, isl, osl)["output_tokens_per_s"]
            out.append({"model": grp["model"], "gpu": grp["gpu"], "tp": grp["tp"], "isl": isl, "osl": osl,
                        "quantization": grp.get("quantization", "fp8"),
                        "concurrency": conc, "published": published, "predicted": round(pred, 1),
                        "error": (pred - published) / published})
    return out


def concurrency_rows() -> list[dict]:
    """NIM's closed-loop sweep: tokens/s, TTFT and ITL at each published concurrency. Beyond the
    concurrency the KV pool holds, the extra users only queue (the engine runs what fits)."""
    d = yaml.safe_load(NIM_DATA.read_text())
    plan = build_plan(PlanInputs(model=d["model"], gpu=d["gpu"], gpus=d["tp"], tp=d["tp"], method="inference",
                                 precision=d["precision"], seq_len=d["input"], generate_len=d["output"],
                                 serving_engine=d["engine"], kv_cache_dtype=d["kv_cache_dtype"]))
    perf, fit = ServingPerf(plan), engine_memory(plan).steady_concurrency(d["input"], d["output"])
    out = []
    for conc, ttft_ms, itl_ms, tps in d["rows"]:
        r = perf.continuous(min(conc, max(fit, 1)), d["input"], d["output"])
        out.append({"concurrency": conc, "running": min(conc, fit), "published": tps,
                    "predicted": round(r["output_tokens_per_s"], 1),
                    "error": (r["output_tokens_per_s"] - tps) / tps, "published_itl_ms": itl_ms,
                    "predicted_tpot_ms": round(r["tpot_s"] * 1e3, 2), "published_ttft_ms": ttft_ms,
                    "predicted_ttft_ms": round(r["ttft_s"] * 1e3, 1) if conc <= fit else None})
    return out


def latency_rows() -> list[dict]:
    data = yaml.safe_load(DATA.read_text())
    out = []
    for tab in data["first_token"]:
        for model, tp, isl, ms in tab["rows"]:
            plan = _plan(model, tab["gpu"], tp, tab["precision"], "auto", 1, isl, 1)
            pred = ServingPerf(plan).prefill_s(1, isl) * 1e3
            out.append({"model": model, "gpu": tab["gpu"], "tp": tp, "isl": isl, "published_ms": ms,
                        "predicted_ms": round(pred, 1), "error": (pred - ms) / ms})
    return out


def main() -> int:
    rows = throughput_rows()
    lat = latency_rows()
    mx = max_load_rows()
    med = statistics.median(abs(r["error"]) for r in rows)
    med_lat = statistics.median(abs(r["error"]) for r in lat)
    med_mx = statistics.median(abs(r["error"]) for r in mx)
    nim = concurrency_rows()
    med_nim = statistics.median(abs(r["error"]) for r in nim)
    if "--json" in sys.argv:
        print(json.dumps({"throughput": rows, "first_token": lat, "max_load": mx, "concurrency": nim,
                          "median_abs_error": med, "median_abs_error_first_token": med_lat,
                          "median_abs_error_max_load": med_mx, "median_abs_error_concurrency": med_nim}, indent=1))
        return 0 if med <= TARGET_MEDIAN else 1
    print(f"{'gpu':14} {'model':12} {'batch':>5} {'tp':>2} {'in':>5} {'out':>5} {'published':>10} "
          f"{'predicted':>10} {'error':>7}")
    for r in rows:
        print(f"{r['gpu']:14} {r['model']:12} {r['batch']:5d} {r['tp']:2d} {r['isl']:5d} {r['osl']:5d} "
              f"{r['published']:10,.0f} {r['predicted']:10,.0f} {r['error']:+7.1%}")
    print(f"median |error| of output tokens/s over {len(rows)} published rows: {med:.1%} "
          f"(target <= {TARGET_MEDIAN:.0%})")
    print()
    print(f"{'gpu':14} {'model':12} {'tp':>2} {'in':>5} {'published ms':>12} {'predicted ms':>12} {'error':>7}")
    for r in lat:
        print(f"{r['gpu']:14} {r['model']:12} {r['tp']:2d} {r['isl']:5d} {r['published_ms']:12.0f} "
              f"{r['predicted_ms']:12.1f} {r['error']:+7.1%}")
    print(f"median |error| of first-token latency over {len(lat)} rows: {med_lat:.1%}")
    print()
    print("max load (TensorRT-LLM perf overview, FP8, batch chosen by the engine):")
    print(f"{'gpu':9} {'model':15} {'tp':>2} {'in':>6} {'out':>5} {'conc':>5} {'published':>10} {'predicted':>10} {'error':>7}")
    for r in mx:
        print(f"{r['gpu']:9} {r['model']:15} {r['tp']:2d} {r['isl']:6d} {r['osl']:5d} {r['concurrency']:5d} "
              f"{r['published']:10,.0f} {r['predicted']:10,.0f} {r['error']:+7.1%}")
    print(f"median |error| of output tokens/s at max load over {len(mx)} rows: {med_mx:.1%}")
    for gpu in sorted({r["gpu"] for r in mx}):
        sub = [abs(r["error"]) for r in mx if r["gpu"] == gpu]
        print(f"  {gpu}: median |error| {statistics.median(sub):.1%} over {len(sub)} rows")
    print()
    print("concurrency sweep (NVIDIA NIM 1.8.0, Llama-3.3-70B fp8 TP2 on 2x H100, 5000 in / 500 out):")
    print(f"{'conc':>5} {'running':>7} {'tok/s pub':>9} {'pred':>7} {'error':>7} {'ITL pub':>8} {'TPOT pred':>9} "
          f"{'TTFT pub':>9} {'pred':>7}")
    for r in nim:
        tt = f"{r['predicted_ttft_ms']:7.0f}" if r["predicted_ttft_ms"] is not None else "  queue"
        print(f"{r['concurrency']:5d} {r['running']:7d} {r['published']:9.0f} {r['predicted']:7.0f} {r['error']:+7.1%} "
              f"{r['published_itl_ms']:8.1f} {r['predicted_tpot_ms']:9.1f} {r['published_ttft_ms']:9.0f} {tt}")
    print(f"median |error| of output tokens/s over {len(nim)} concurrency levels: {med_nim:.1%}")
    return 0 if med <= TARGET_MEDIAN else 1


if __name__ == "__main__":
    raise SystemExit(main())
