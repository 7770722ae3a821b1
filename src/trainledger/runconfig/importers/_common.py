"""Shared helpers of the per-tool importers: numbers, precision, optimizer names, LoRA blocks,
and a model named by its dimensions (Megatron/NeMo/torchtitan) mapped to a preset or a generic
config.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from trainledger.errors import SpecError
from trainledger.runconfig.formats import OPTIM_FROM_HF, ImportResult, num_value

__all__ = ["num", "truthy", "set_precision", "set_hf_optim", "set_lora_targets", "model_from_dims",
           "relevant_unknown"]

num = num_value


def truthy(v: Any) -> bool:
    """YAML/TOML/argv truth: true, 'true', 'auto' (axolotl: bf16 auto = on where supported), 1."""
    if isinstance(v, str):
        return v.strip().lower() in ("true", "1", "yes", "on", "auto")
    return bool(v)


def set_precision(res: ImportResult, where: str, *, bf16: Any = None, fp16: Any = None,
                  fp8: Any = None, fp32: Any = None) -> None:
    """bf16/fp16/fp8 switches -> the recipe's precision (fp8 runs with bf16 master compute)."""
    on = [name for name, v in (("bf16", bf16), ("fp16", fp16)) if v is not None and truthy(v)]
    if len(on) > 1:
        from trainledger.errors import PlanError

        raise PlanError(f"{where}: bf16 and fp16 are both on; set one")
    if fp8 is not None and truthy(fp8):
        res.set("precision", "fp8-mixed", where)
    elif on:
        res.set("precision", f"{on[0]}-mixed", where)
    elif fp32 is not None and truthy(fp32):
        res.set("precision", "fp32", where)


#: bitsandbytes / torch optimizer names of axolotl, TRL, LLaMA-Factory (TrainingArguments ``optim``)
OPTIM_EXTRA = {"paged_adamw_32bit": "adamw", "adamw_torch_4bit": "adamw-8bit", "paged_adamw": "adamw",
               "adamw_apex_fused": "adamw-fused", "adamw_torch_npu_fused": "adamw-fused",
               "adam": "adamw", "adamw": "adamw", "adamw_bnb_8bit": "adamw-8bit",
               "lion_8bit": "lion", "paged_lion_8bit": "lion", "sgd": "sgd"}


def set_hf_optim(res: ImportResult, value: Any, where: str, key: str = "optim") -> None:
    o = str(value).strip().lower()
    mapped = OPTIM_FROM_HF.get(o) or OPTIM_EXTRA.get(o)
    if mapped is None:
        res.unknown_keys.append(f"{where}: {key}={value} (optimizer not modeled; its state size is unknown)")
        return
    res.set("optimizer", mapped, where)


def set_lora_targets(res: ImportResult, targets: Any, where: str) -> None:
    """A list of module names, one comma-separated string, or 'all'/'all-linear' (= the default)."""
    if targets is None:
        return
    if isinstance(targets, str):
        if targets.strip().lower() in ("all", "all-linear", "all_linear"):
            return
        targets = [t.strip() for t in targets.split(",") if t.strip()]
    if isinstance(targets, (list, tuple)) and targets:
        res.set("lora_targets", tuple(sorted(str(t) for t in targets)), where)


def relevant_unknown(res: ImportResult, where: str, data: dict[str, Any], words: tuple[str, ...],
                     known: set[str]) -> None:
    """Report keys that look memory/time relevant (contain one of ``words``) and are not understood."""
    for k in sorted(data):
        if k in known:
            continue
        v = data[k]
        if v in (None, False, "", [], {}):
            continue  # an unset option changes nothing
        if any(w in k.lower() for w in words):
            res.unknown_keys.append(f"{where}: {k}")


# ----------------------------------------------------------------------------- model by dimensions
_DIM_KEYS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
             "intermediate_size", "vocab_size")


def _preset_dims() -> dict[str, tuple]:
    from trainledger.load.hf import load_model, preset_names

    out = {}
    for name in preset_names():
        try:
            m = load_model(name)
        except Exception:  # noqa: BLE001 - a broken preset is not a match
            continue
        if m.moe is not None:
            continue
        out[name] = (m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads, m.intermediate_size,
                     m.vocab_size, m.mlp_type)
    return out


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "trainledger" / "imported-models"


def model_from_dims(dims: dict[str, Any], where: str, res: ImportResult, label: str,
                    padded_vocab: int | None = None) -> str:
    """A preset whose dimensions equal ``dims`` (Hugging Face key names); else a generic config.json
    written under ``$XDG_CACHE_HOME/trainledger/imported-models`` (named by its content hash).

    ``padded_vocab``: the embedding rows the framework really allocates (Megatron pads the
    vocabulary); presets match on the tokenizer's size, a generic config gets the padded one."""
    missing = [k for k in _DIM_KEYS if dims.get(k) is None]
    if missing:
        raise SpecError(f"{where}: the model is given by its dimensions but {', '.join(missing)} "
                        f"{'is' if len(missing) == 1 else 'are'} not set ({label}); add them or pass --model")
    mlp = dims.get("mlp_type", "gated")
    want = tuple(int(dims[k]) for k in _DIM_KEYS) + (mlp,)
    for name, have in _preset_dims().items():
        if have == want:
            pad = "" if not padded_vocab or padded_vocab == dims["vocab_size"] else (
                f" (the framework pads the vocabulary to {padded_vocab} rows; the preset has {dims['vocab_size']})")
            res.notes.append(f"{where}: model dimensions match preset {name}{pad}")
            return name
    cfg = {"model_type": "generic", **{k: int(dims[k]) for k in _DIM_KEYS}}
    if padded_vocab:
        cfg["vocab_size"] = padded_vocab
    for k in ("mlp_type", "norm_type", "bias", "position_embedding", "tie_word_embeddings",
              "max_position_embeddings", "hidden_act", "head_dim"):
        if dims.get(k) is not None:
            cfg[k] = dims[k]
    blob = json.dumps(cfg, sort_keys=True)
    path = cache_dir() / f"generic-{hashlib.sha256(blob.encode()).hexdigest()[:12]}.json"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
        tmp.replace(path)
    res.notes.append(f"{where}: model given by dimensions ({label}); no preset matches, using the "
                     f"generic config {path}")
    return str(path)
