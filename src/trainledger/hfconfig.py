"""Read a Hugging Face ``config.json`` into a ModelSpec, and find configs by name.

``load_model(ref)`` accepts a bundled preset name, a local ``config.json`` (or a folder holding
one), or a Hub id, which is resolved only from the local Hugging Face cache or — when reachable —
the Hub. Remote code is never executed: ``auto_map`` is ignored and only known ``model_type``
families are accepted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ._spec import spec_error
from .catalog import _entries, read_data_file
from .errors import CatalogError, SpecError, did_you_mean
from .model import ModelSpec

SUPPORTED_FAMILIES: tuple[str, ...] = ("llama", "mistral", "generic")


def _get(cfg: dict[str, Any], key: str, where: str, default: Any = ...) -> Any:
    if key in cfg and cfg[key] is not None:
        return cfg[key]
    if default is ...:
        raise SpecError(f"{where}: missing field {key!r}")
    return default


def from_hf_config(cfg: dict[str, Any], name: str = "config.json", source: str | None = None) -> ModelSpec:
    """Build a ModelSpec from a parsed config.json mapping."""
    if not isinstance(cfg, dict):
        raise SpecError(f"{name}: expected a JSON object")
    mt = cfg.get("model_type")
    if mt not in SUPPORTED_FAMILIES:
        raise SpecError(
            f"{name}: model_type {mt!r} is not supported; supported: {', '.join(SUPPORTED_FAMILIES)}"
        )
    h = _get(cfg, "hidden_size", name)
    a = _get(cfg, "num_attention_heads", name)
    fields = dict(
        name=name,
        model_type=mt,
        source=source,
        hidden_size=h,
        num_layers=_get(cfg, "num_hidden_layers", name),
        num_heads=a,
        num_kv_heads=_get(cfg, "num_key_value_heads", name, a),
        head_dim=_get(cfg, "head_dim", name, h // a if isinstance(h, int) and isinstance(a, int) and a else 1),
        intermediate_size=_get(cfg, "intermediate_size", name),
        vocab_size=_get(cfg, "vocab_size", name),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=bool(cfg.get("attention_bias", False)),
        o_bias=bool(cfg.get("attention_bias", False)),
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        max_position_embeddings=cfg.get("max_position_embeddings", 4096),
        sliding_window=cfg.get("sliding_window"),
    )
    try:
        return ModelSpec.model_validate(fields)
    except ValidationError as exc:
        raise spec_error(exc, name) from None


def preset_names() -> list[str]:
    return list(_entries("models"))


def load_hf_config(ref: str | Path) -> dict[str, Any]:
    """The raw config.json mapping behind ``load_model(ref)`` (for building the real model).

    Keys starting with '_' (our preset metadata such as ``_source``) are removed.
    """
    s = str(ref)
    p = Path(s)
    if p.is_dir():
        p = p / "config.json"
    if p.suffix == ".json" or p.exists():
        if not p.exists():
            raise SpecError(f"{p}: no such file")
        data = read_data_file(p)
    else:
        presets = _entries("models")
        if s.lower() not in presets:
            raise CatalogError(f"unknown model {s!r}.{did_you_mean(s, presets)}")
        data = read_data_file(presets[s.lower()])
    if not isinstance(data, dict):
        raise SpecError(f"{s}: expected a JSON object")
    return {k: v for k, v in data.items() if not str(k).startswith("_")}


def load_model(ref: str | Path) -> ModelSpec:
    """A ModelSpec from a preset name, a config.json path (or its folder), or a cached Hub id."""
    s = str(ref)
    p = Path(s)
    if p.is_dir():
        p = p / "config.json"
    if p.suffix == ".json" or p.exists():
        if not p.exists():
            raise SpecError(f"{p}: no such file")
        data = read_data_file(p)
        return from_hf_config(data, name=str(p), source=str(p))
    presets = _entries("models")
    if s.lower() in presets:
        data = read_data_file(presets[s.lower()])
        src = data.pop("_source", None) if isinstance(data, dict) else None
        return from_hf_config(data, name=s.lower(), source=src)
    raise CatalogError(f"unknown model {s!r}.{did_you_mean(s, presets)} "
                       "Give a preset (`trainledger models`), a config.json path or a cached Hub id.")
