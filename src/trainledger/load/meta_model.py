"""Any Hub architecture transformers knows: build it on the meta device, read its layer structure.

``spec_from_transformers(cfg)`` instantiates ``AutoModelForCausalLM.from_config`` under
``torch.device("meta")`` (no memory, no weights, never remote code: ``model_type`` must be one of
transformers' own ``CONFIG_MAPPING``), reads the decoder layer's modules (attention projections
and their biases, gated or plain MLP, norm class and count, q/k norms, learned positions) and builds
the ModelSpec the estimator needs. The ModelSpec's parameter count must equal the meta model's
``sum(p.numel())`` exactly; an architecture with parts the estimator cannot express (MoE experts,
extra towers, ...) is refused with the parameters it could not place.
"""

from __future__ import annotations

from typing import Any

from trainledger.errors import MissingDependency, SpecError

_SKIP = {"model_type", "auto_map", "architectures", "_name_or_path", "transformers_version", "torch_dtype", "dtype"}


def _imports() -> tuple[Any, Any]:
    try:
        import torch
        import transformers
    except ImportError:
        raise MissingDependency("building an architecture that has no built-in reader needs transformers "
                                "and torch: pip install 'trainledger[verify]'") from None
    return torch, transformers


def _decoder_layers(model: Any, torch: Any) -> Any:
    best = None
    for _, mod in model.named_modules():
        if isinstance(mod, torch.nn.ModuleList) and len(mod) and len({type(m) for m in mod}) == 1:
            if best is None or sum(p.numel() for p in mod.parameters()) > sum(p.numel() for p in best.parameters()):
                best = mod
    if best is None:
        raise SpecError("no stack of identical decoder layers found")
    return best


def _outside(model: Any, layer_cls: type) -> list[Any]:
    """Direct submodules of the model's body that are not decoder layers (final norm, embeddings)."""
    out = []
    for mod in model.modules():
        if isinstance(mod, layer_cls):
            continue
        for child in mod.children():
            if not isinstance(child, layer_cls) and not any(isinstance(a, layer_cls) for a in child.modules()):
                out.append(child)
    return out


def _flags(layer: Any, model: Any, torch: Any) -> dict[str, Any]:
    names = {n for n, _ in layer.named_parameters()}

    def has(*suffixes: str) -> bool:
        return any(n.endswith(s) for n in names for s in suffixes)

    if has("experts.0.weight", "experts.gate_up_proj", ".experts.0.w1.weight") or any(".experts." in n for n in names):
        raise SpecError("mixture-of-experts layers are read only for the built-in MoE families")
    norms = [m for m in layer.modules() if "norm" in type(m).__name__.lower() and m is not layer]
    top_norms = [m for n, m in layer.named_children() if "norm" in type(m).__name__.lower()
                 and any(True for _ in m.parameters())]  # OLMo's LayerNorm has no weights
    rms = any("rms" in type(m).__name__.lower() for m in norms)
    f: dict[str, Any] = {
        "qkv_bias": has("q_proj.bias", "qkv_proj.bias", "query_key_value.bias", "c_attn.bias", "Wqkv.bias"),
        "o_bias": has("o_proj.bias", "attention.dense.bias", "out_proj.bias", "attn.c_proj.bias", "self_attn.dense.bias"),
        "mlp_bias": has("up_proj.bias", "fc1.bias", "dense_h_to_4h.bias", "mlp.c_fc.bias", "down_proj.bias"),
        "mlp_type": "gated" if has("gate_proj.weight", "gate_up_proj.weight", "w3.weight") else "plain",
        "norm_type": "rmsnorm" if rms else "layernorm",
        "norm_bias": any(getattr(m, "bias", None) is not None for m in top_norms),
        "norms_per_layer": len(top_norms),
        "final_norm": any("norm" in type(m).__name__.lower() and any(True for _ in m.parameters())
                          for m in _outside(model, layer.__class__)),
        "qk_norm": "head" if has("q_norm.weight", "q_layernorm.weight") else "none",
        "fused_qkv": has("qkv_proj.weight", "query_key_value.weight", "c_attn.weight", "Wqkv.weight"),
        "fused_gate_up": has("gate_up_proj.weight"),
    }
    pos = [n for n, _ in model.named_parameters() if n.endswith(("wpe.weight", "embed_positions.weight"))]
    f["position_embedding"] = "learned" if pos else "rope"
    out = model.get_output_embeddings()
    f["lm_head_bias"] = getattr(out, "bias", None) is not None
    return f


#: the largest model built on the meta device (building is O(layers) Python work)
MAX_META_LAYERS = 2048
MAX_META_WIDTH = 1_000_000


def spec_from_transformers(cfg: dict[str, Any], name: str, source: str | None = None) -> Any:
    """A ModelSpec for ``cfg`` (a config.json mapping) whose model_type has no built-in reader.

    Every failure is one SpecError line naming the file (transformers' own errors included)."""
    from trainledger.errors import TrainledgerError

    try:
        return _spec_from_transformers(cfg, name, source)
    except TrainledgerError:
        raise
    except Exception as exc:  # noqa: BLE001 - a config transformers cannot build is a user error
        text = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        raise SpecError(f"{name}: transformers could not build model_type {str(cfg.get('model_type'))[:60]!r} "
                        f"from this config ({text})") from None


def _sane(cfg: dict[str, Any], name: str) -> None:
    for key, hi in (("num_hidden_layers", MAX_META_LAYERS), ("n_layer", MAX_META_LAYERS),
                    ("hidden_size", MAX_META_WIDTH), ("n_embd", MAX_META_WIDTH),
                    ("intermediate_size", 10 * MAX_META_WIDTH), ("vocab_size", 100_000_000)):
        v = cfg.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= hi):
            raise SpecError(f"{name}: {key} must be an integer in 1..{hi} to build the model (got {str(v)[:40]})")


def _spec_from_transformers(cfg: dict[str, Any], name: str, source: str | None = None) -> Any:
    torch, transformers = _imports()
    from trainledger.load.families import Cfg, generic
    from trainledger.spec.model import ModelSpec

    mt = cfg.get("model_type")
    if mt not in transformers.CONFIG_MAPPING:
        raise SpecError(f"{name}: model_type {str(mt)[:60]!r} is not supported: it is not built into transformers "
                        f"{transformers.__version__} (remote code is never run); write a config with "
                        "\"model_type\": \"generic\" and its dimensions")
    _sane(cfg, name)
    conf = transformers.AutoConfig.for_model(mt, **{k: v for k, v in cfg.items() if k not in _SKIP})
    text = conf.get_text_config() if hasattr(conf, "get_text_config") else conf
    try:
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(conf, trust_remote_code=False)
    except (ValueError, KeyError) as exc:
        raise SpecError(f"{name}: transformers has no causal-LM class for model_type {mt!r} ({exc})") from None
    total = sum(p.numel() for p in model.parameters())
    layers = _decoder_layers(model, torch)
    try:
        flags = _flags(layers[0], model, torch)
    except SpecError as exc:
        raise SpecError(f"{name}: {exc}") from None
    dims = {"hidden_size": text.hidden_size, "num_hidden_layers": len(layers),
            "num_attention_heads": text.num_attention_heads,
            "num_key_value_heads": getattr(text, "num_key_value_heads", None) or text.num_attention_heads,
            "intermediate_size": getattr(text, "intermediate_size", None) or getattr(text, "ffn_dim", None)
            or 4 * text.hidden_size,
            "vocab_size": text.vocab_size, "tie_word_embeddings": bool(getattr(text, "tie_word_embeddings", False)),
            "max_position_embeddings": getattr(text, "max_position_embeddings", 4096) or 4096,
            "hidden_act": str(getattr(text, "hidden_act", "silu")),
            "mlp_type": flags["mlp_type"], "norm_type": flags["norm_type"],
            "position_embedding": flags["position_embedding"]}
    hd = getattr(text, "head_dim", None)
    if hd:
        dims["head_dim"] = hd
    fields = generic(Cfg(dims, name))
    fields.update({k: flags[k] for k in ("qkv_bias", "o_bias", "mlp_bias", "norm_bias", "norms_per_layer",
                                         "qk_norm", "fused_qkv", "fused_gate_up", "lm_head_bias", "final_norm")})
    fields["tie_word_embeddings"] = model.get_output_embeddings() is None or (
        model.get_output_embeddings().weight is model.get_input_embeddings().weight)
    fields.update(name=name, model_type=mt, source=source,
                  notes=(f"structure read from transformers' {type(model).__name__} on the meta device",))
    spec = ModelSpec.model_validate(fields)
    if spec.params.total != total:
        raise SpecError(f"{name}: {type(model).__name__} has {total:,} parameters; the structure read from it "
                        f"gives {spec.params.total:,} — this architecture has parts the estimator does not "
                        "model; write a generic config to size it approximately")
    return spec
