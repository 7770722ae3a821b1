"""Read a Hugging Face ``config.json`` into a ModelSpec, and find configs by name.

``load_model(ref)`` accepts a bundled preset name, a local ``config.json`` (or a folder holding
one), or a Hub id (``owner/name``). A Hub id is resolved, in order, from a bundled preset whose
``_source`` is that id, from the local Hugging Face cache, and — only when ``HF_HUB_OFFLINE`` is
unset and the Hub answers within a few seconds — from the Hub itself. Remote code is never
executed: ``auto_map`` is ignored and only the ``model_type`` families in
:data:`trainledger.load.families.FAMILIES` are accepted.
"""

from __future__ import annotations

import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from trainledger.spec.base import spec_error
from trainledger.load.catalog import entries, read_data_file
from trainledger.errors import CatalogError, SpecError, did_you_mean
from trainledger.load.families import FAMILIES, FAMILY_DEFAULTS, Cfg
from trainledger.spec.model import ModelSpec
from trainledger.safety import clip, is_dir, path_exists, shorten

SUPPORTED_FAMILIES: tuple[str, ...] = tuple(FAMILIES)
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")
HUB_TIMEOUT_S = 5.0  # an unreachable Hub must not stall the CLI


def text_config(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    """gemma3 (multimodal): the language model is ``text_config``; the vision tower is not counted."""
    text = cfg.get("text_config")
    if text is None:
        text = {}
    if not isinstance(text, dict):
        raise SpecError(f"{name}: field 'text_config' must be a JSON object")
    out = dict(text)
    out["model_type"] = "gemma3_text"
    if "tie_word_embeddings" not in out and "tie_word_embeddings" in cfg:
        out["tie_word_embeddings"] = cfg["tie_word_embeddings"]
    return out


#: config.json ``torch_dtype`` (``dtype`` since transformers 4.56) -> our dtype names
_CKPT_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "half": "fp16", "float": "fp32"}


def _checkpoint_dtype(cfg: dict[str, Any]) -> str | None:
    """The dtype the checkpoint's weights are stored in, as config.json states it (None: not stated)."""
    raw = cfg.get("dtype", cfg.get("torch_dtype"))
    return _CKPT_DTYPES.get(str(raw).removeprefix("torch.")) if isinstance(raw, str) else None


def checkpoint_quantization(cfg: dict[str, Any]) -> str | None:
    """The weight format a checkpoint ships, from config.json ``quantization_config`` (what vLLM and
    SGLang load without a --quantization flag), named as --quantization names it; None when the
    config states none or a method this model does not price (compressed-tensors, HQQ, ...).

    ``fp8``: DeepSeek-V3 ships 128×128 block-scaled e4m3 (``weight_block_size``), fp8 W8A8
    checkpoints per tensor; one fp32 scale per 128×128 block is 0.02% of the weight bytes, which
    the per-tensor format leaves out. ``mxfp4``: gpt-oss. ``awq``/``gptq``: int4 with group
    scales. ``bitsandbytes`` 4-bit NF4 -> ``nf4``. ModelOpt ``NVFP4`` / ``FP8`` -> nvfp4 / fp8."""
    q = cfg.get("quantization_config")
    if not isinstance(q, dict):
        return None
    method = str(q.get("quant_method", "")).lower()
    if method in ("fp8", "mxfp4", "awq", "gptq"):
        return method
    if method == "bitsandbytes":
        four = q.get("load_in_4bit") and str(q.get("bnb_4bit_quant_type", "")).lower() == "nf4"
        return "nf4" if four else None
    if method == "modelopt":
        return {"nvfp4": "nvfp4", "fp8": "fp8"}.get(str(q.get("quant_algo", "")).lower())
    return None


def from_hf_config(cfg: Any, name: str = "config.json", source: str | None = None) -> ModelSpec:
    """Build a ModelSpec from a parsed config.json mapping (see :mod:`trainledger.load.families`)."""
    if not isinstance(cfg, dict):
        raise SpecError(f"{name}: expected a JSON object with a 'model_type' field")
    mt = cfg.get("model_type")
    notes: tuple[str, ...] = ()
    if mt == "gemma3":
        cfg, mt = text_config(cfg, name), "gemma3_text"
        notes = ("text model only: the vision tower and projector of gemma3 are not counted",)
    if isinstance(mt, str) and mt and mt not in FAMILIES:
        return _from_transformers(cfg, name, source, mt)
    if not isinstance(mt, str) or mt not in FAMILIES:
        hint = "" if isinstance(mt, str) and mt else " (the field is missing)"
        raise SpecError(f"{name}: model_type {clip(mt)} is not supported{hint}; supported: "
                        f"{', '.join(SUPPORTED_FAMILIES)}, gemma3. For another architecture write a "
                        "config with \"model_type\": \"generic\" and its dimensions.")
    fields = FAMILIES[mt](Cfg(cfg, name, FAMILY_DEFAULTS.get(mt)))
    fields.update(name=name, model_type=mt, source=source, checkpoint_dtype=_checkpoint_dtype(cfg),
                  checkpoint_quantization=checkpoint_quantization(cfg))
    fields["notes"] = tuple(fields.get("notes", ())) + notes
    try:
        return ModelSpec.model_validate(fields)
    except ValidationError as exc:
        raise spec_error(exc, name) from None


def _from_transformers(cfg: dict[str, Any], name: str, source: str | None, mt: str) -> ModelSpec:
    """An architecture without a built-in reader: built by transformers on the meta device
    (``trainledger.load.meta_model``), or a message naming the extra on a core install."""
    import importlib.util

    if importlib.util.find_spec("transformers") is None or importlib.util.find_spec("torch") is None:
        raise SpecError(f"{name}: model_type {clip(mt)} has no built-in reader (built in: "
                        f"{', '.join(SUPPORTED_FAMILIES)}, gemma3); pip install 'trainledger[verify]' lets "
                        "trainledger build it with transformers on the meta device, or write a config with "
                        "\"model_type\": \"generic\" and its dimensions.")
    from trainledger.load.meta_model import spec_from_transformers

    return spec_from_transformers(cfg, name, source).model_copy(
        update={"checkpoint_quantization": checkpoint_quantization(cfg)})


def preset_names() -> list[str]:
    """Names of the bundled model presets."""
    return list(entries("models"))


@lru_cache(maxsize=None)
def preset_sources() -> dict[str, str]:
    """Hub id (lower case) -> preset name, for presets whose ``_source`` is a Hub id."""
    out: dict[str, str] = {}
    for name, path in entries("models").items():
        data = read_data_file(path)
        src = data.get("_source") if isinstance(data, dict) else None
        if isinstance(src, str) and HUB_ID.match(src):
            out[src.lower()] = name
    return out


#: suffixes of fine-tuned variants whose config.json is the base model's (same shapes; chat template
#: and generation config differ): Llama 3.x "-Instruct", Qwen2.5 "-Instruct", Gemma "-it", "-chat"
_VARIANT_SUFFIXES = ("-instruct", "-chat", "-it")


def base_preset_hint(repo_id: str) -> str:
    """' The bundled preset X (its base) has the same architecture: --model X' for an instruct/chat
    variant of a preset's Hub id, else ''. A hint in an error, never a silent substitution."""
    want = repo_id.lower()
    for suffix in _VARIANT_SUFFIXES:
        if want.endswith(suffix) and want.removesuffix(suffix) in preset_sources():
            name = preset_sources()[want.removesuffix(suffix)]
            return (f" Its base {repo_id[: len(repo_id) - len(suffix)]} is the bundled preset {name}, with the "
                    f"same architecture: --model {name}.")
    return ""


def _read_config(path: Path) -> Any:
    if is_dir(path):
        path = path / "config.json"
    if not path_exists(path):
        raise SpecError(f"{shorten(str(path))}: no such file")
    return read_data_file(path), str(path)


def hub_offline() -> bool:
    """Whether huggingface_hub is told to stay offline (HF_HUB_OFFLINE, as huggingface_hub reads it)."""
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def _hub_config_path(repo_id: str) -> Path | None:
    """config.json of a Hub repo from the local HF cache, or (online only) downloaded; None if neither."""
    try:
        from huggingface_hub import hf_hub_download, try_to_load_from_cache
    except ImportError:
        return None
    cache_dir = os.environ.get("HF_HUB_CACHE") or None
    try:
        hit = try_to_load_from_cache(repo_id, "config.json", cache_dir=cache_dir)
    except Exception:  # an invalid id or unreadable cache is a miss, not a crash
        hit = None
    if isinstance(hit, str):
        return Path(hit)
    if hub_offline():
        return None
    got = _download_bounded(hf_hub_download, repo_id, cache_dir)
    return Path(got) if got else None


class HubUnreachable(CatalogError):
    """The Hub did not answer within HUB_TIMEOUT_S."""


def _download_bounded(download: Any, repo_id: str, cache_dir: str | None) -> str | None:
    """One attempt at config.json, at most HUB_TIMEOUT_S seconds, nothing printed; None when the Hub
    answered that there is no such (public) repo; HubUnreachable when it did not answer in time."""
    import logging
    import threading

    out: dict[str, Any] = {}

    def work() -> None:
        try:
            out["path"] = download(repo_id, "config.json", cache_dir=cache_dir, etag_timeout=HUB_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - classified below
            out["error"] = exc

    log = logging.getLogger("huggingface_hub")
    level = log.level
    log.setLevel(logging.CRITICAL)  # its retry warnings would print one line per attempt
    try:
        t = threading.Thread(target=work, name="trainledger-hub", daemon=True)
        t.start()
        t.join(HUB_TIMEOUT_S)
    finally:
        log.setLevel(level)
    if "path" in out:
        return str(out["path"])
    err = out.get("error")
    unreachable = err is None or any(w in type(err).__name__ for w in ("Connect", "Timeout", "Network", "Offline")) \
        or "connect" in str(err).lower() or "resolve" in str(err).lower()
    if unreachable:
        cache = os.environ.get("HF_HUB_CACHE") or os.path.join(
            os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface"), "hub")
        raise HubUnreachable(
            f"{clip(repo_id, 80)} is not cached in {cache} and the Hub did not answer within "
            f"{HUB_TIMEOUT_S:g} s; without network set HF_HUB_OFFLINE=1 and put config.json in that cache "
            f"(huggingface-cli download {clip(repo_id, 80)} config.json), or give a config.json path."
            + base_preset_hint(repo_id))
    return None


def resolve_config(ref: str | Path) -> tuple[Any, str, str | None]:
    """(parsed config.json, display name, source) for a preset, a path, or a Hub id.

    The preset metadata key ``_source`` is popped from the mapping.
    """
    s = str(ref).strip()
    p = Path(s)
    presets = entries("models")
    if p.suffix == ".json" or path_exists(p):
        data, name = _read_config(p)
        source = None
    elif s.lower() in presets:
        data, name, source = read_data_file(presets[s.lower()]), s.lower(), None
    elif HUB_ID.match(s) and s.lower() in preset_sources():
        name = preset_sources()[s.lower()]
        data, source = read_data_file(presets[name]), None
    else:
        hub = _hub_config_path(s) if HUB_ID.match(s) else None
        if hub is None and HUB_ID.match(s) and "/" in s:
            why = "the Hub is offline (HF_HUB_OFFLINE is set)" if hub_offline() else \
                "the Hub could not be reached (or the repo is gated or missing)"
            raise CatalogError(f"model {clip(s, 80)} is not in the local cache and {why}. Download it once "
                               f"with `huggingface-cli download {clip(s, 80)} config.json`, give a "
                               f"config.json path, or a preset (`trainledger models`)." + base_preset_hint(s))
        if hub is None:
            choices = list(presets) + list(preset_sources())
            raise CatalogError(f"unknown model {clip(s, 80)}.{did_you_mean(s[:200], choices)} Give a preset "
                               "(`trainledger models`), a config.json path, or a Hub id that is cached "
                               "locally or reachable.")
        data, name = _read_config(hub)
        source = s
    if isinstance(data, dict):
        src = data.pop("_source", None)
        source = source or (src if isinstance(src, str) else None)
    return data, name, source or (name if p.suffix == ".json" or path_exists(p) else None)


def load_hf_config(ref: str | Path) -> dict[str, Any]:
    """The raw config.json mapping behind ``load_model(ref)`` (for building the real model).

    Keys starting with '_' (our preset metadata such as ``_source``) are removed.
    """
    data, name, _ = resolve_config(ref)
    if not isinstance(data, dict):
        raise SpecError(f"{name}: expected a JSON object")
    return {k: v for k, v in data.items() if not str(k).startswith("_")}


def load_model(ref: str | Path) -> ModelSpec:
    """A ModelSpec from a preset name, a config.json path (or its folder), or a Hub id."""
    data, name, source = resolve_config(ref)
    return from_hf_config(data, name=name, source=source)
