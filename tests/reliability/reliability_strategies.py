"""Hypothesis strategies and helpers shared by the reliability tests and ``bench/fuzz_report.py``.

Two input spaces:

* ``raw_inputs()`` — every PlanInputs field drawn independently (degrees need not divide the GPU
  count, cp need not divide seq_len ...): the library must answer with a TrainledgerError or a
  finite, non-negative ledger, never anything else;
* ``valid_inputs()`` — a layout built to be consistent (gpus = dp·tp·pp·cp, tp divides the
  heads, pp <= layers, cp divides seq_len, ep divides experts and dp·cp), over bundled presets and
  synthetic ``generic`` / ``llama`` config.json mappings; the invariants are checked on these.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

from hypothesis import strategies as st

from trainledger.load.catalog import names
from trainledger.load.hf import from_hf_config, load_model, preset_names
from trainledger.spec.model import ModelSpec
from trainledger.spec.recipe import ATTENTIONS, METHODS, OPTIMIZERS, PRECISIONS, RECOMPUTES

#: presets small enough that a whole estimate (with its scaling curve) takes milliseconds, plus a
#: few large/MoE/MLA ones so that every family and size regime is drawn.
PRESETS = tuple(preset_names())
SMALL_PRESETS = ("tiny-llama-debug", "tiny-gpt2-debug", "tiny-qwen3-moe-debug",
                 "tiny-deepseek-v3-debug", "qwen2.5-0.5b", "llama-3.2-1b", "gemma-2-2b",
                 "pythia-1b", "gpt2", "phi-3-mini", "mixtral-8x7b", "deepseek-v3", "llama-3.1-8b")
GPUS = tuple(names("gpus"))
POW2 = (1, 2, 4, 8)


@lru_cache(maxsize=None)
def preset(name: str) -> ModelSpec:
    return load_model(name)


def numeric_leaves(obj: Any, path: str = "") -> Iterator[tuple[str, float]]:
    """Every int/float in a nested to_dict() result, with its dotted path (bools excluded)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from numeric_leaves(v, f"{path}.{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from numeric_leaves(v, f"{path}[{i}]")
    elif isinstance(obj, bool):
        return
    elif isinstance(obj, (int, float)):
        yield path, obj


def bad_numbers(obj: Any) -> list[str]:
    """Paths of numbers that are NaN, infinite or negative."""
    out = []
    for p, v in numeric_leaves(obj):
        if not math.isfinite(v):
            out.append(f"{p}={v!r} (not finite)")
        elif v < 0:
            out.append(f"{p}={v!r} (negative)")
    return out


# ----------------------------------------------------------------------------- raw space
def raw_inputs() -> st.SearchStrategy[dict[str, Any]]:
    """Every field independently, including edge values at and beyond the accepted ranges."""
    big = st.sampled_from([1, 2, 3, 7, 8, 64, 1000, 10**6, 10**7, 10**9])
    return st.fixed_dictionaries({
        "model": st.sampled_from(PRESETS),
        "gpu": st.sampled_from(GPUS),
        "gpus": st.sampled_from([1, 2, 3, 4, 8, 12, 16, 64, 1024, 65536]),
        "method": st.sampled_from(METHODS),
        "precision": st.sampled_from(PRECISIONS),
        "optimizer": st.sampled_from(OPTIMIZERS),
        "recompute": st.sampled_from(RECOMPUTES),
        "attention": st.sampled_from(ATTENTIONS),
        "seq_len": big,
        "micro_batch": big,
        "grad_accum": st.sampled_from([1, 2, 3, 1000, 10**6]),
        "tp": st.sampled_from([1, 2, 3, 4, 8, 1024]),
        "pp": st.sampled_from([1, 2, 4, 7, 200]),
        "cp": st.sampled_from([1, 2, 3]),
        "ep": st.sampled_from([1, 2, 8, 64]),
        "vp": st.sampled_from([1, 2]),
        "zero": st.integers(0, 3),
        "offload": st.sampled_from(["none", "optimizer", "params"]),
        "hybrid_shard": st.booleans(),
        "lora_rank": st.sampled_from([1, 16, 65536]),
        "tokens": st.one_of(st.none(), st.sampled_from([1.0, 1e6, 1e12, 1e18])),
        "global_batch": st.one_of(st.none(), st.sampled_from([1, 7, 256, 10**6])),
        "generate_len": st.sampled_from([0, 1, 4096]),
        "headroom": st.sampled_from([0.0, 0.1, 0.5]),
    })


# --------------------------------------------------------------------------- valid space
@st.composite
def synthetic_model(draw: st.DrawFn) -> ModelSpec:
    """A ``generic`` or ``llama`` config.json with random but legal dimensions."""
    heads = draw(st.sampled_from([1, 2, 4, 6, 8, 12, 16, 32, 64]))
    kv = draw(st.sampled_from([d for d in (1, 2, 4, 8, 16, 32, 64) if heads % d == 0]))
    head_dim = draw(st.sampled_from([8, 16, 64, 128]))
    cfg = {
        "model_type": draw(st.sampled_from(["generic", "llama"])),
        "hidden_size": heads * head_dim,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": head_dim,
        "num_hidden_layers": draw(st.integers(1, 96)),
        "intermediate_size": draw(st.integers(1, 65536)),
        "vocab_size": draw(st.integers(2, 300_000)),
        "tie_word_embeddings": draw(st.booleans()),
        "max_position_embeddings": 131072,
    }
    if cfg["model_type"] == "generic":
        cfg["mlp_type"] = draw(st.sampled_from(["gated", "plain"]))
        cfg["norm_type"] = draw(st.sampled_from(["rmsnorm", "layernorm"]))
        cfg["bias"] = draw(st.booleans())
    return from_hf_config(cfg, name="synthetic.json")


def models() -> st.SearchStrategy[ModelSpec]:
    return st.one_of(st.sampled_from(SMALL_PRESETS).map(preset), synthetic_model())


def _divisors(n: int, among: tuple[int, ...]) -> list[int]:
    return [d for d in among if n % d == 0]


@st.composite
def valid_case(draw: st.DrawFn, model: ModelSpec | None = None,
               training: bool | None = None) -> tuple[dict[str, Any], ModelSpec]:
    """(PlanInputs mapping, ModelSpec) whose layout is consistent by construction."""
    m = model or draw(models())
    tp = draw(st.sampled_from(_divisors(m.num_heads, POW2)))
    pp = draw(st.sampled_from([p for p in POW2 if p <= m.num_layers]))
    cp = draw(st.sampled_from([1, 2]))
    dp = draw(st.sampled_from([1, 2, 3, 4, 8]))
    seq = cp * draw(st.sampled_from([1, 16, 127, 512, 2048, 8192]))
    ep = 1
    if m.moe is not None:
        ep = draw(st.sampled_from([e for e in POW2 if m.moe.num_experts % e == 0 and (dp * cp) % e == 0]))
    gpus = dp * tp * pp * cp
    methods = METHODS if training is None else [x for x in METHODS if (x != "inference") == training]
    d = {
        "model": m.name, "gpu": draw(st.sampled_from(GPUS)), "gpus": gpus,
        "gpus_per_node": math.gcd(gpus, 8),
        "method": draw(st.sampled_from(methods)),
        "precision": draw(st.sampled_from(PRECISIONS)),
        "optimizer": draw(st.sampled_from(OPTIMIZERS)),
        "recompute": draw(st.sampled_from(RECOMPUTES)),
        "attention": draw(st.sampled_from(ATTENTIONS)),
        "seq_len": seq, "micro_batch": draw(st.integers(1, 16)),
        "grad_accum": draw(st.sampled_from([1, 2, 8])),
        "dp": dp, "tp": tp, "pp": pp, "cp": cp, "ep": ep, "sp": tp > 1,
        "zero": draw(st.integers(0, 3)),
        "offload": draw(st.sampled_from(["none", "none", "optimizer", "params"])),
        "lora_rank": draw(st.sampled_from([1, 8, 64])),
        "tokens": draw(st.one_of(st.none(), st.sampled_from([1e6, 1e9, 2e12]))),
        "generate_len": draw(st.sampled_from([0, 256])),
    }
    return d, m
