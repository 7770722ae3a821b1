"""Serving launch commands: export an inference plan as ``vllm serve`` / SGLang arguments and read them back.

vLLM flags (docs: serving/engine_args, ``vllm serve --help``): ``--tensor-parallel-size``,
``--pipeline-parallel-size``, ``--max-model-len``, ``--gpu-memory-utilization``, ``--kv-cache-dtype``
(auto | fp8 | fp8_e4m3 | fp8_e5m2), ``--max-num-seqs``, ``--max-num-batched-tokens``, ``--block-size``,
``--quantization`` (fp8, awq, gptq, bitsandbytes, ...), ``--dtype``, ``--enforce-eager``.
SGLang flags (python/sglang/srt/server_args.py): ``--model-path``, ``--tp-size``, ``--pp-size``,
``--context-length``, ``--mem-fraction-static``, ``--kv-cache-dtype``, ``--max-running-requests``,
``--chunked-prefill-size``, ``--page-size``, ``--quantization``, ``--dtype``, ``--disable-cuda-graph``.

Each script carries the plan inputs in a ``# trainledger-plan: {...}`` header line, so ``--from``
restores what the flags do not say (the GPU type, prompt and output lengths).
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from trainledger.spec.plan import Plan
from trainledger.load.plan import PlanInputs

SERVING_FORMATS = ("vllm", "sglang")

#: our precision -> the engines' --dtype
DTYPE = {"bf16-mixed": "bfloat16", "bf16": "bfloat16", "fp16-mixed": "float16", "fp16": "float16",
         "fp32": "float32", "fp8-mixed": "bfloat16"}
#: our quantization -> the engines' --quantization
QUANT = {"fp8": "fp8", "int8": "compressed-tensors", "awq": "awq", "gptq": "gptq", "nf4": "bitsandbytes",
         "nvfp4": "modelopt_fp4", "mxfp4": "mxfp4"}
KV_VLLM = {"auto": "auto", "bf16": "auto", "fp16": "auto", "fp8": "fp8"}
KV_SGLANG = {"auto": "auto", "bf16": "auto", "fp16": "auto", "fp8": "fp8_e4m3"}


def model_id(plan: Plan) -> str:
    """The Hub id the engine should load (the preset's source), else the spec's name."""
    src = plan.model.source or ""
    return src if src.count("/") == 1 and " " not in src and not src.startswith("http") else plan.model.name


def _quant(plan: Plan) -> str | None:
    q = plan.serving.quantization
    if q == "none" and plan.recipe.policy["weights"] == "fp8":
        q = "fp8"
    return QUANT.get(q)


def vllm_args(plan: Plan) -> list[str]:
    """``vllm serve`` arguments of an inference plan (engine defaults resolved by trainledger)."""
    from trainledger.estimate.serving.engine import resolve

    es = resolve(plan)
    lay, s = plan.layout, plan.serving
    args = ["vllm", "serve", model_id(plan), "--tensor-parallel-size", str(lay.tp)]
    if lay.pp > 1:
        args += ["--pipeline-parallel-size", str(lay.pp)]
    args += ["--dtype", DTYPE[plan.recipe.precision], "--max-model-len", str(es.max_model_len),
             "--gpu-memory-utilization", f"{s.gpu_memory_utilization:g}",
             "--kv-cache-dtype", KV_VLLM[s.kv_cache_dtype], "--max-num-seqs", str(es.max_num_seqs),
             "--max-num-batched-tokens", str(es.max_num_batched_tokens), "--block-size", str(es.block_size)]
    q = _quant(plan)
    if q:
        args += ["--quantization", q]
    if not s.cuda_graphs:
        args.append("--enforce-eager")
    return args


def sglang_args(plan: Plan) -> list[str]:
    """``python -m sglang.launch_server`` arguments of an inference plan."""
    from trainledger.estimate.serving.engine import resolve

    es = resolve(plan)
    lay, s = plan.layout, plan.serving
    args = ["python", "-m", "sglang.launch_server", "--model-path", model_id(plan), "--tp-size", str(lay.tp)]
    if lay.pp > 1:
        args += ["--pp-size", str(lay.pp)]
    args += ["--dtype", DTYPE[plan.recipe.precision], "--context-length", str(es.max_model_len),
             "--mem-fraction-static", f"{s.gpu_memory_utilization:g}",
             "--kv-cache-dtype", KV_SGLANG[s.kv_cache_dtype], "--max-running-requests", str(es.max_num_seqs),
             "--chunked-prefill-size", str(es.max_num_batched_tokens), "--page-size", str(es.block_size)]
    q = _quant(plan)
    if q:
        args += ["--quantization", q]
    if not s.cuda_graphs:
        args.append("--disable-cuda-graph")
    return args


def serving_script(plan: Plan, inputs: PlanInputs, fmt: str, head: list[str]) -> tuple[str, str]:
    """(file name, text) of the launch script for ``fmt`` (vllm or sglang)."""
    engine = "vllm" if fmt == "vllm" else "sglang"
    plan_e = plan.model_copy(update={"serving": plan.serving.model_copy(update={"engine": engine})})
    args = vllm_args(plan_e) if fmt == "vllm" else sglang_args(plan_e)
    lines = ["#!/usr/bin/env bash"] + [f"# {ln}" for ln in head if not ln.startswith("trainledger-plan:")]
    data = inputs.model_dump(mode="json", exclude_defaults=True)
    data.update(method="inference", serving_engine=engine)
    lines.append("# trainledger-plan: " + json.dumps(data, separators=(",", ":")))
    lines.append("set -euo pipefail")
    lines.append(_pretty(args) + ' "$@"')
    return f"serve_{fmt}.sh", "\n".join(lines) + "\n"


def _pretty(args: list[str]) -> str:
    """The command, one ``--flag value`` pair per line."""
    first = next(i for i, a in enumerate(args) if a.startswith("--"))
    parts = [" ".join(shlex.quote(a) for a in args[:first])]
    i = first
    while i < len(args):
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            parts.append(f"{args[i]} {shlex.quote(args[i + 1])}")
            i += 2
        else:
            parts.append(args[i])
            i += 1
    return " \\\n  ".join(parts)


def detect_serving(text: str) -> str | None:
    """'vllm' or 'sglang' when ``text`` is a launch script of that engine, else None."""
    for line in _command_lines(text):
        toks = line.split()
        if len(toks) >= 2 and toks[0].endswith("vllm") and toks[1] == "serve":
            return "vllm"
        if "sglang.launch_server" in line:
            return "sglang"
    return None


def _command_lines(text: str) -> list[str]:
    joined = text.replace("\\\n", " ")
    return [ln.strip() for ln in joined.splitlines() if ln.strip() and not ln.strip().startswith("#")]


_VLLM_FLAGS = {"--tensor-parallel-size": "tp", "-tp": "tp", "--pipeline-parallel-size": "pp", "-pp": "pp",
               "--max-model-len": "max_model_len", "--gpu-memory-utilization": "gpu_memory_utilization",
               "--kv-cache-dtype": "kv_cache_dtype", "--max-num-seqs": "max_num_seqs",
               "--max-num-batched-tokens": "max_num_batched_tokens", "--block-size": "block_size",
               "--quantization": "quantization", "-q": "quantization", "--dtype": "precision"}
_SGLANG_FLAGS = {"--tp-size": "tp", "--tp": "tp", "--pp-size": "pp", "--context-length": "max_model_len",
                 "--mem-fraction-static": "gpu_memory_utilization", "--kv-cache-dtype": "kv_cache_dtype",
                 "--max-running-requests": "max_num_seqs", "--chunked-prefill-size": "max_num_batched_tokens",
                 "--page-size": "block_size", "--quantization": "quantization", "--dtype": "precision"}
_BACK_DTYPE = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32"}
_BACK_QUANT = {"fp8": "fp8", "awq": "awq", "awq_marlin": "awq", "gptq": "gptq", "gptq_marlin": "gptq",
               "bitsandbytes": "nf4", "compressed-tensors": "int8", "modelopt_fp4": "nvfp4", "mxfp4": "mxfp4"}
_INT_KEYS = {"tp", "pp", "max_model_len", "max_num_seqs", "max_num_batched_tokens", "block_size"}


def parse_serving(text: str, fmt: str) -> tuple[dict[str, Any], list[str]]:
    """(plan inputs, flags not understood) read from a vLLM or SGLang launch command."""
    flags = _VLLM_FLAGS if fmt == "vllm" else _SGLANG_FLAGS
    line = next(ln for ln in _command_lines(text) if detect_serving(ln) == fmt)
    toks = shlex.split(line)
    out: dict[str, Any] = {"method": "inference", "serving_engine": fmt}
    unknown: list[str] = []
    i = 0
    while i < len(toks):
        tok = toks[i]
        key, val = (tok.split("=", 1) + [None])[:2] if tok.startswith("--") and "=" in tok else (tok, None)
        if key in ("--enforce-eager", "--disable-cuda-graph"):
            out["cuda_graphs"] = False
        elif key in flags:
            if val is None and i + 1 < len(toks):
                val = toks[i + 1]
                i += 1
            out[flags[key]] = val
        elif key in ("--model-path", "--model"):
            i += 1  # the model, read below
        elif key == "-m":
            i += 1  # python -m sglang.launch_server
        elif key.startswith("-") and key != '"$@"':
            unknown.append(key)
        i += 1
    if fmt == "vllm":
        toks_cmd = [t for t in toks if not t.startswith("-")]
        if len(toks_cmd) >= 3:
            out["model_id"] = toks_cmd[2]
    else:
        for j, t in enumerate(toks):
            if t in ("--model-path", "--model") and j + 1 < len(toks):
                out["model_id"] = toks[j + 1]
    return _normalise(out), unknown


def _normalise(d: dict[str, Any]) -> dict[str, Any]:
    out = dict(d)
    for k in _INT_KEYS & set(out):
        out[k] = int(out[k])
    if "gpu_memory_utilization" in out:
        out["gpu_memory_utilization"] = float(out["gpu_memory_utilization"])
    if "precision" in out:
        out["precision"] = _BACK_DTYPE.get(str(out["precision"]), "bf16")
    if "kv_cache_dtype" in out:
        v = str(out["kv_cache_dtype"])
        out["kv_cache_dtype"] = "fp8" if v.startswith("fp8") else "auto"
    if "quantization" in out:
        out["quantization"] = _BACK_QUANT.get(str(out["quantization"]), "none")
        if out["quantization"] == "fp8" and out.get("precision") in (None, "bf16"):
            out.pop("precision", None)
    tp, pp = out.get("tp", 1), out.get("pp", 1)
    out["gpus"] = tp * pp
    return out


def preset_for(hub_id: str) -> str:
    """The bundled preset whose source is ``hub_id`` (instruct variants share the base's config), else
    the id itself."""
    from trainledger.load.hf import preset_sources

    want = hub_id.lower().removesuffix("-instruct")
    for src, name in preset_sources().items():  # source (lower case) -> preset
        if src and src.lower().removesuffix("-instruct") == want:
            return name
    return hub_id


def reader(fmt: str):
    """An importer reader (data, ImportResult, where) for a vLLM or SGLang launch script."""

    def read(data: Any, res: Any, where: str) -> None:
        found, unknown = parse_serving(str(data), fmt)
        mid = found.pop("model_id", None)
        if mid and "model" not in res.header:
            res.set("model", preset_for(mid), where)
        for k, v in found.items():
            res.set(k, v, where)
        res.unknown_keys.extend(f"{where}: {u}" for u in unknown)

    return read
