"""Megatron-LM launch scripts and NeMo launch arguments / YAML.

Megatron-LM: the ``--kebab-case`` arguments of ``pretrain_gpt.py`` (megatron/training/arguments.py
in NVIDIA/Megatron-LM), as written in its example scripts: shell variables (``TP=4``,
``${TP:-4}``, ``$((A*B))``) and bash arrays (``MODEL_ARGS=( ... )``) are expanded before reading.
NeMo: Hydra overrides (``model.tensor_model_parallel_size=4``, ``trainer.devices=8``) and NeMo
``megatron_gpt_config.yaml`` files use the same names with underscores (NeMo
examples/nlp/language_modeling/conf/megatron_gpt_config.yaml); NeMo 2 ``--factory`` recipes map to
presets.

Defaults that change memory are Megatron's own when a script does not set them
(megatron/training/arguments.py): ``attention_dropout`` and ``hidden_dropout`` 0.1; no sequence
parallelism unless ``--sequence-parallel``; embeddings tied unless
``--untie-embeddings-and-output-weights``; linear biases on unless ``--disable-bias-linear``;
``ffn_hidden_size`` = 4 × hidden; ``num_query_groups`` = heads without ``--group-query-attention``.
``--use-distributed-optimizer`` shards optimizer states over data parallel (ZeRO-1).
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from trainledger.errors import SpecError
from trainledger.runconfig.formats import ImportResult
from trainledger.runconfig.importers._common import model_from_dims, num

#: NeMo 2 recipe (``--factory``) -> preset (nemo/collections/llm/recipes/*.py; same dimensions)
NEMO_RECIPES = {"llama3_8b": "llama-3.1-8b", "llama31_8b": "llama-3.1-8b", "llama3_70b": "llama-3.1-70b",
                "llama31_70b": "llama-3.1-70b", "llama31_405b": "llama-3.1-405b",
                "mixtral_8x7b": "mixtral-8x7b", "mistral_7b": "mistral-7b", "qwen2_7b": "qwen2.5-7b"}
#: Megatron-FSDP sharding strategy -> ZeRO stage
MEGATRON_FSDP_ZERO = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
#: GPT-2 BPE vocabulary (``--vocab-file gpt2-vocab.json``): 50257 tokens (Radford et al. 2019)
GPT2_VOCAB = 50257

_SCRIPT_MARKERS = ("pretrain_gpt.py", "pretrain_mamba.py", "--tensor-model-parallel-size",
                   "--num-layers", "--micro-batch-size", "megatron_gpt_pretraining.py",
                   "model.tensor_model_parallel_size", "trainer.devices", "--factory")

USED = {"tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
        "expert_model_parallel_size", "sequence_parallel", "micro_batch_size", "global_batch_size",
        "seq_length", "encoder_seq_length", "bf16", "fp16", "fp8_format", "fp8", "use_distributed_optimizer",
        "recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_activations",
        "activations_checkpoint_granularity", "activations_checkpoint_method",
        "activations_checkpoint_num_layers", "clip_grad", "gradient_clip_val", "optimizer",
        "attention_dropout", "hidden_dropout", "num_layers", "hidden_size", "ffn_hidden_size",
        "num_attention_heads", "group_query_attention", "num_query_groups", "kv_channels", "vocab_size",
        "swiglu", "normalization", "untie_embeddings_and_output_weights", "share_embeddings_and_output_weights",
        "disable_bias_linear", "bias", "position_embedding_type", "max_position_embeddings", "vocab_file",
        "tokenizer_type", "tokenizer_model", "nproc_per_node", "nnodes", "devices", "num_nodes",
        "virtual_pipeline_model_parallel_size", "num_layers_per_virtual_pipeline_stage", "precision",
        "deepspeed", "deepspeed_config", "zero_stage", "use_flash_attn", "attention_backend", "attention",
        "use_mcore_models", "factory", "train_iters", "train_samples", "cpu_offloading",
        "optimizer_cpu_offload", "accumulate_grad_batches", "limit_val_batches", "limit_test_batches",
        "grad_div_ar_fusion", "max_steps", "use_megatron_fsdp", "data_parallel_sharding_strategy", "recompute_modules", "make_vocab_size_divisible_by", "merge_file", "transformer_impl", "gradient_accumulation_fusion", "num_experts",
        "moe_router_topk", "mtp_num_layers", "fp8_param_gather", "overlap_grad_reduce",
        "overlap_param_gather", "tp_comm_overlap", "ub_tp_comm_overlap", "empty_unused_memory_level", "activation_func",
        "fp8_recipe", "fp4_format", "fp4_recipe", "expert_tensor_parallel_size", "first_last_layers_bf16",
        "num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16", "cross_entropy_loss_fusion",
        "grad_reduce_in_bf16", "grad_sync_dtype", "fp8_params", "moe_token_dispatcher_type", "moe_enable_deepep",
        "moe_flex_dispatcher_backend", "moe_expert_capacity_factor", "moe_pad_expert_input_to_capacity",
        "moe_train_capacity_factor", "disable_moe_token_dropping", "moe_shared_expert_overlap",
        "overlap_moe_expert_parallel_comm", "exp_avg_dtype", "exp_avg_sq_dtype", "moe_enable_hybridep",
        "use_precision_aware_optimizer"}
#: arguments that change memory or time: reported when set and not understood
_RELEVANT = ("parallel", "recompute", "offload", "checkpoint", "fp8", "fp4", "moe", "expert",
             "batch", "seq", "overlap", "mtp", "layers", "hidden", "heads", "vocab", "optimizer",
             "precision", "zero", "cuda_graph", "fusion")


def detect_text(text: str) -> bool:
    return any(m in text for m in _SCRIPT_MARKERS)


# ----------------------------------------------------------------------------- shell expansion
_ASSIGN = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)(\+?)=(.*)$")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*|[0-9]+)(?::?-([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")
_ARR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\[@\]\}")


def _expand(s: str, env: dict[str, str], arrays: dict[str, list[str]]) -> str:
    s = _ARR.sub(lambda m: " ".join(arrays.get(m.group(1), [])), s)

    def var(m: re.Match) -> str:
        name = m.group(1) or m.group(3)
        if name in env:
            return env[name]
        default = m.group(2)
        return _expand(default.strip('"\''), env, arrays) if default is not None else ""

    s = _VAR.sub(var, s)

    def arith(m: re.Match) -> str:
        expr = m.group(1)
        if re.fullmatch(r"[\d\s+*/()-]+", expr):
            try:
                return str(int(eval(expr, {"__builtins__": {}}, {})))  # noqa: S307 - digits and operators only
            except (SyntaxError, ZeroDivisionError, TypeError):
                return m.group(0)
        return m.group(0)

    return re.sub(r"\$\(\((.*?)\)\)", arith, s)


def _logical_lines(text: str) -> list[str]:
    text = re.sub(r"\\\n", " ", text)
    return text.splitlines()


def script_tokens(text: str) -> list[str]:
    """The argument tokens of a launch script, variables and arrays expanded (last value wins)."""
    env: dict[str, str] = {}
    arrays: dict[str, list[str]] = {}
    tokens: list[str] = []
    lines = _logical_lines(text)
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        m = _ASSIGN.match(line)
        if m and m.group(3).lstrip().startswith("("):
            body = m.group(3).lstrip()[1:]
            while ")" not in _strip_comment(body) and i < len(lines):
                body += "\n" + lines[i]
                i += 1
            body = _strip_comment_lines(body.rsplit(")", 1)[0])
            items = _split(_expand(body, env, arrays))
            arrays[m.group(1)] = (arrays.get(m.group(1), []) if m.group(2) else []) + items
            continue
        if m and not m.group(2):
            val = _expand(_strip_comment(m.group(3)).strip(), env, arrays)
            try:
                parts = shlex.split(val)
                val = parts[0] if parts else ""
            except ValueError:
                val = val.strip('"\'')
            env[m.group(1)] = val
            continue
        tokens += _split(_expand(_strip_comment(line), env, arrays))
    for items in arrays.values():
        tokens += items
    return tokens


def _strip_comment(s: str) -> str:
    return re.sub(r"(^|\s)#.*$", "", s)


def _strip_comment_lines(s: str) -> str:
    return "\n".join(_strip_comment(ln) for ln in s.splitlines())


def _split(s: str) -> list[str]:
    try:
        raw = shlex.split(s, comments=True)
    except ValueError:
        raw = s.split()
    out: list[str] = []
    for t in raw:
        out += t.split() if t.startswith("--") and " " in t else [t]
    return out


#: Megatron-LM arguments that take several values (argparse nargs='+')
_LIST_ARGS = frozenset({"recompute_modules"})


def parse_args(tokens: list[str]) -> dict[str, Any]:
    """``--a-b 3``, ``--flag``, ``--a=3`` and Hydra ``x.y.a_b=3`` -> {a_b: value} (True for flags)."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        t = tokens[i]
        i += 1
        if t.startswith("--"):
            key, eq, val = t[2:].partition("=")
            key = key.replace("-", "_")
            if eq:
                out[key] = val
            elif i < len(tokens) and not tokens[i].startswith("--") and "=" not in tokens[i]:
                out[key] = tokens[i]
                i += 1
                if key in _LIST_ARGS:  # nargs='+': every value up to the next flag
                    vals = [out[key]]
                    while i < len(tokens) and not tokens[i].startswith("--") and "=" not in tokens[i]:
                        vals.append(tokens[i])
                        i += 1
                    out[key] = vals
            else:
                out[key] = True
        elif "=" in t and re.match(r"^[+~]?[A-Za-z_][\w.]*=", t):
            key, _, val = t.lstrip("+~").partition("=")
            leaf = key.rsplit(".", 1)[-1]
            if key.endswith("optim.name") or key.endswith("optim.config.optimizer"):
                leaf = "optimizer"
            elif key.endswith("optim.grad_sync_dtype"):
                leaf = "grad_sync_dtype"
            elif leaf == "plugins":  # NeMo 2: trainer.plugins=bf16_mixed
                leaf = "precision"
                val = val.replace("_", "-")
            out[leaf] = val
    return out


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """NeMo YAML -> {last_key: value}; ``trainer`` and ``model`` keys keep their leaf names."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, str) and (v.startswith("${") or v == "???"):
            continue  # an OmegaConf interpolation or a required value: says nothing itself
        if k == "tokenizer" and isinstance(v, dict):
            out.update({f"tokenizer_{t}": tv for t, tv in v.items() if tv is not None})
        elif k == "optim" and isinstance(v, dict):
            out["optimizer"] = v.get("name")
            if v.get("grad_sync_dtype") is not None:  # Apex distributed_fused_adam's gradient dtype
                out["grad_sync_dtype"] = v["grad_sync_dtype"]
        elif k in ("exp_manager", "nsys_profile"):
            continue  # logging and profiling
        elif isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        elif v is not None:
            out[str(k)] = v
    return out


# ----------------------------------------------------------------------------- reading
def _int(a: dict[str, Any], key: str, where: str) -> int | None:
    v = a.get(key)
    if v is None or v is True:
        return None
    try:
        return num(int(str(v)), where, "--" + key.replace("_", "-"))
    except ValueError:
        raise SpecError(f"{where}: --{key.replace('_', '-')} must be a positive integer (got {v!r}); "
                        "is a shell variable left unset?") from None


def _on(a: dict[str, Any], key: str) -> bool:
    v = a.get(key)
    return v is True or str(v).lower() in ("true", "1", "yes")


#: Megatron-LM's own entry points: their ``--tp-comm-overlap`` is off unless given (store_true in
#: megatron/training/arguments.py), where NeMo's recipes turn it on for their performance runs
_MEGATRON_LM_ENTRY = ("pretrain_gpt.py", "pretrain_mamba.py")


def read_text(text: str, res: ImportResult, where: str) -> None:
    read_args(parse_args(script_tokens(text)), res, where,
              megatron_lm=any(e in text for e in _MEGATRON_LM_ENTRY))


def read_nemo_yaml(d: dict[str, Any], res: ImportResult, where: str) -> None:
    read_args(flatten(d), res, where)


def detect_nemo_yaml(d: dict[str, Any]) -> bool:
    return isinstance(d.get("model"), dict) and isinstance(d.get("trainer"), dict) \
        and any(k in d["model"] for k in ("tensor_model_parallel_size", "encoder_seq_length", "micro_batch_size"))


def _read_capacity(a: dict[str, Any], res: ImportResult, where: str, deepspeed: bool) -> None:
    """The experts' capacity: Megatron-Core ``--moe-expert-capacity-factor`` (dropless when unset)
    with ``--moe-pad-expert-input-to-capacity``; Megatron-DeepSpeed ``--moe-train-capacity-factor``
    (DeepSpeed-MoE's top-k gating dispatches through an [S, E, C] einsum: always padded)."""
    key = "moe_train_capacity_factor" if deepspeed else "moe_expert_capacity_factor"
    v = a.get(key)
    if deepspeed and v is None and a.get("num_experts") and not _on(a, "disable_moe_token_dropping"):
        v = 1.0  # Megatron-DeepSpeed's default --moe-train-capacity-factor
    if v is None or str(v).lower() in ("none", "null") or (deepspeed and _on(a, "disable_moe_token_dropping")):
        return
    try:
        factor = float(str(v))
    except ValueError:
        res.unknown_keys.append(f"{where}: --{key.replace('_', '-')} {v} (not a number)")
        return
    res.set("moe_capacity_factor", factor, where)
    res.set("moe_pad_to_capacity", deepspeed or _on(a, "moe_pad_expert_input_to_capacity"), where)


def _read_dispatcher(a: dict[str, Any], res: ImportResult, where: str) -> None:
    """The MoE token dispatcher: ``--moe-token-dispatcher-type`` allgather (Megatron's default:
    all-gather the tokens over the TP×EP group), alltoall, or flex with DeepEP
    (``--moe-enable-deepep``; later releases ``--moe-flex-dispatcher-backend deepep|hybridep``, deepep
    by default, or hybridep: NVIDIA's Hybrid-EP)."""
    kind = str(a.get("moe_token_dispatcher_type", "allgather")).lower()
    backend = str(a.get("moe_flex_dispatcher_backend", "deepep")).lower()
    if (kind == "flex" and backend == "hybridep") or _on(a, "moe_enable_hybridep"):
        res.set("moe_dispatcher", "hybridep", where)  # NVIDIA's Hybrid-EP (--moe-enable-hybridep at first)
    elif kind == "flex" or _on(a, "moe_enable_deepep"):
        res.set("moe_dispatcher", "deepep", where)
    elif kind == "alltoall":
        res.set("moe_dispatcher", "alltoall", where)
    elif kind == "allgather" and (a.get("num_experts") or a.get("num_moe_experts")):
        res.set("moe_dispatcher", "allgather", where)
    elif kind not in ("allgather", "alltoall"):
        res.unknown_keys.append(f"{where}: --moe-token-dispatcher-type {kind} (sized as alltoall)")


#: Megatron-Core's names of the precision-aware optimizer's state dtypes -> ours
_STATE_DTYPES = {"fp32": "fp32", "float32": "fp32", "bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16",
                 "float16": "fp16"}


def _read_state_dtypes(a: dict[str, Any], res: ImportResult, where: str) -> None:
    """The precision-aware optimizer's moment dtypes (Megatron-LM ``--exp-avg-dtype`` /
    ``--exp-avg-sq-dtype``, with ``--use-precision-aware-optimizer``; fp32 by default)."""
    got = [str(a[k]).lower().removeprefix("torch.") for k in ("exp_avg_dtype", "exp_avg_sq_dtype") if a.get(k)]
    if not got:
        if _on(a, "use_precision_aware_optimizer"):  # fp32 moments, 16-bit master remainders
            res.set("optimizer_states_dtype", "fp32", where)
        return
    dtypes = {_STATE_DTYPES.get(g) for g in got}
    if len(dtypes) == 1 and None not in dtypes:
        res.set("optimizer_states_dtype", dtypes.pop(), where)
    else:
        res.unknown_keys.append(f"{where}: --exp-avg-dtype / --exp-avg-sq-dtype {' / '.join(got)} (moments in "
                                "different or 8-bit dtypes: sized as fp32)")


def _read_tp_overlap(a: dict[str, Any], res: ImportResult, where: str, megatron_lm: bool) -> None:
    """TP communication overlap (Transformer Engine's userbuffers): Megatron-LM ``--tp-comm-overlap``,
    NeMo ``model.ub_tp_comm_overlap`` (NeMo 1.x configs; NeMo 2's recipes set it through their
    comm-overlap callback, the stack profile's Hopper default). A Megatron-LM script without the flag
    runs its TP collectives exposed."""
    if "tp_comm_overlap" in a or "ub_tp_comm_overlap" in a:
        res.set("tp_comm_overlap", _on(a, "tp_comm_overlap") or _on(a, "ub_tp_comm_overlap"), where)
    elif megatron_lm:
        res.set("tp_comm_overlap", False, where)


def read_args(a: dict[str, Any], res: ImportResult, where: str, megatron_lm: bool = False,
              dims: bool = True) -> None:
    """``megatron_lm``: the arguments of a Megatron-LM entry point (``pretrain_gpt.py``), whose
    switches are off unless given (a NeMo config leaves what it does not say to its recipe).
    ``dims``: build the model from its dimension arguments (False: the caller named the model)."""
    deepspeed = _on(a, "deepspeed") or a.get("deepspeed_config") is not None
    res.set("framework", "megatron-deepspeed" if deepspeed else "megatron-core", where)
    tp = _int(a, "tensor_model_parallel_size", where) or 1
    res.set("tp", tp, where)
    pp = _int(a, "pipeline_model_parallel_size", where) or 1
    res.set("pp", pp, where)
    res.set("cp", _int(a, "context_parallel_size", where), where)
    res.set("ep", _int(a, "expert_model_parallel_size", where), where)
    res.set("etp", _int(a, "expert_tensor_parallel_size", where), where)
    if tp > 1:
        res.set("sp", _on(a, "sequence_parallel"), where)
    vp = _int(a, "virtual_pipeline_model_parallel_size", where)
    per_stage = _int(a, "num_layers_per_virtual_pipeline_stage", where)
    layers = _int(a, "num_layers", where)
    if vp is None and per_stage and layers:
        vp = layers // (pp * per_stage)
    if vp and vp > 1:
        res.set("vp", vp, where)
    res.set("micro_batch", _int(a, "micro_batch_size", where), where)
    res.set("seq_len", _int(a, "seq_length", where) or _int(a, "encoder_seq_length", where), where)
    prec = str(a.get("precision", "")).lower()
    if a.get("fp4_format") or _on(a, "fp4"):  # --fp4-format e2m1 (--fp4-recipe nvfp4, the only one)
        res.set("precision", "nvfp4-mixed", where)
        # --first-last-layers-bf16: 1 + 1 layers unless --num-layers-at-{start,end}-in-bf16 say more
        kept = (_int(a, "num_layers_at_start_in_bf16", where) or 1) + (_int(a, "num_layers_at_end_in_bf16", where) or 1)
        res.set("fp4_bf16_layers", kept if _on(a, "first_last_layers_bf16") else 0, where)
    elif (a.get("fp8_format") or _on(a, "fp8")) and str(a.get("fp8_recipe", "")).lower() == "mxfp8":
        res.set("precision", "mxfp8-mixed", where)
    elif a.get("fp8_format") or _on(a, "fp8") or "fp8" in prec:
        res.set("precision", "fp8-mixed", where)
    elif _on(a, "bf16") or prec in ("bf16", "bf16-mixed"):
        res.set("precision", "bf16-mixed", where)
    elif _on(a, "fp16") or prec in ("16", "16-mixed", "fp16-mixed"):
        res.set("precision", "fp16-mixed", where)
    elif prec in ("32", "fp32", "32-true"):
        res.set("precision", "fp32", where)
    elif not deepspeed:
        res.set("precision", "fp32", where)
        res.notes.append(f"{where}: neither --bf16 nor --fp16: Megatron trains in fp32")
    if _on(a, "use_megatron_fsdp"):
        # Megatron-FSDP: --data-parallel-sharding-strategy no_shard|optim|optim_grads|optim_grads_params
        # (megatron/training/arguments.py; default optim_grads_params = ZeRO-3)
        strategy = str(a.get("data_parallel_sharding_strategy", "optim_grads_params"))
        res.set("zero", MEGATRON_FSDP_ZERO.get(strategy, 3), where)
    elif _on(a, "use_distributed_optimizer"):
        res.set("zero", 1, where)
    if deepspeed and a.get("zero_stage") is not None:
        res.set("zero", _int(a, "zero_stage", where) if str(a["zero_stage"]) != "0" else 0, where)
    gran = a.get("recompute_granularity") or a.get("activations_checkpoint_granularity")
    if _on(a, "recompute_activations"):
        gran = "selective"
    if gran and str(gran).lower() not in ("null", "none"):
        res.set("recompute", "full" if str(gran) == "full" else "selective", where)
    mods = a.get("recompute_modules")
    if gran == "selective" and mods:
        names = [str(x) for x in mods] if isinstance(mods, (list, tuple)) else str(mods).split()
        if names != ["core_attn"]:
            res.unknown_keys.append(f"{where}: --recompute-modules {' '.join(names)} (per-module recomputation: "
                                    "sized as Megatron's default selective recomputation, the attention core)")
    if a.get("clip_grad") is not None or a.get("gradient_clip_val") is not None:
        res.set("grad_clip", float(a.get("clip_grad", a.get("gradient_clip_val"))), where)
    opt = str(a.get("optimizer") or "adam").lower()
    opt = "adam" if opt in ("mcore_adam", "distributed_fused_adam_mcore") else opt
    res.set("optimizer", {"adam": "adamw", "adamw": "adamw", "fused_adam": "adamw-fused",
                          "distributed_fused_adam": "adamw-fused", "sgd": "sgd-momentum"}.get(opt), where)
    if opt not in ("adam", "adamw", "fused_adam", "distributed_fused_adam", "sgd"):
        res.unknown_keys.append(f"{where}: --optimizer {opt} (state size not modeled)")
    _read_state_dtypes(a, res, where)
    backend = str(a.get("attention_backend", "auto")).lower()
    # Megatron-Core's backends (megatron/core/transformer/enums.py AttnBackend): auto/fused pick
    # Transformer Engine's fused kernels, which keep no s×s scores (the estimator's sdpa = flash);
    # unfused/local materialise them (eager)
    if backend in ("unfused", "local"):
        res.set("attention", "eager", where)
    elif backend == "flash":
        res.set("attention", "flash", where)
    # Megatron's own default is 0.1; NeMo 2's Llama/Mistral/Qwen recipes set 0.0
    # (nemo/collections/llm/gpt/model/llama.py Llama3Config: attention_dropout = hidden_dropout = 0.0)
    default_dropout = 0.0 if a.get("factory") else 0.1
    ad = float(a.get("attention_dropout", default_dropout))
    hd = float(a.get("hidden_dropout", default_dropout))
    res.set("dropout", max(ad, hd), where)
    # --cross-entropy-loss-fusion (NeMo: model.cross_entropy_loss_fusion); off by default
    # (megatron/core/model_parallel_config.py); Megatron-DeepSpeed has no such flag
    if not deepspeed and _on(a, "cross_entropy_loss_fusion"):
        res.set("fused_loss", True, where)
    if not deepspeed:
        # the gradient buffer's dtype: Megatron-LM --grad-reduce-in-bf16 (core_r0.12.0; fp32
        # otherwise with --bf16), NeMo 1.x optim.grad_sync_dtype (Apex DistributedFusedAdam: the
        # state dtype, fp32, when unset)
        if _on(a, "grad_reduce_in_bf16") or str(a.get("grad_sync_dtype", "")).lower() in ("bf16", "bfloat16"):
            res.set("reduce_dtype", "bf16", where)
        # fp8 weights: Megatron-LM --fp8-param-gather, NeMo 1.x model.fp8_params
        if _on(a, "fp8_param_gather") or _on(a, "fp8_params"):
            res.set("fp8_params", True, where)
        if opt == "distributed_fused_adam":  # NeMo 1.x: Apex DistributedFusedAdam, sharded over DP
            res.set("dist_optimizer", "apex", where)
            res.set("zero", 1, where)
        _read_dispatcher(a, res, where)
        # MoE communication overlap: the shared experts under the dispatch (--moe-shared-expert-overlap),
        # one micro-batch's all-to-all under another's compute (--overlap-moe-expert-parallel-comm)
        if _on(a, "moe_shared_expert_overlap"):
            res.set("moe_shared_expert_overlap", True, where)
        if _on(a, "overlap_moe_expert_parallel_comm"):
            res.set("ep_comm_overlap", True, where)
        if tp > 1:
            _read_tp_overlap(a, res, where, megatron_lm)
    _read_capacity(a, res, where, deepspeed)
    _gpus(a, res, where)
    _global_batch(a, res, where, tp, pp)
    if dims:
        _model(a, res, where, layers)
    if _on(a, "cpu_offloading") or _on(a, "optimizer_cpu_offload"):
        res.set("offload", "optimizer" if _on(a, "optimizer_cpu_offload") else "params", where)
    if a.get("num_experts"):
        res.unknown_keys.append(f"{where}: --num-experts {a['num_experts']} (MoE from launch arguments "
                                "is not modeled: pass --model with the MoE config.json)")
    for k in sorted(a):
        if k not in USED and any(w in k for w in _RELEVANT) and a[k] not in (False, None, "null"):
            res.unknown_keys.append(f"{where}: --{k.replace('_', '-')}")


def _global_batch(a: dict[str, Any], res: ImportResult, where: str, tp: int, pp: int) -> None:
    """--global-batch-size = micro-batch × grad-accum × dp: grad-accum when the world size is known."""
    gb = _int(a, "global_batch_size", where)
    if gb is None:
        return
    gpus, mb = res.inputs.get("gpus"), res.inputs.get("micro_batch", 1)
    cp = res.inputs.get("cp", 1) or 1
    if gpus is None or gpus % (tp * pp * cp):
        res.set("global_batch", gb, where)
        return
    dp = gpus // (tp * pp * cp)
    if gb % (mb * dp):
        from trainledger.errors import PlanError

        raise PlanError(f"{where}: --global-batch-size {gb} is not micro-batch × dp × grad-accum: "
                        f"{mb} × {dp} = {mb * dp} does not divide {gb}")
    res.set("grad_accum", gb // (mb * dp), where)


def _gpus(a: dict[str, Any], res: ImportResult, where: str) -> None:
    per_node = _int(a, "nproc_per_node", where) or _int(a, "devices", where)
    nodes = _int(a, "nnodes", where) or _int(a, "num_nodes", where) or 1
    if per_node:
        res.set("gpus", per_node * nodes, where)
        res.set("gpus_per_node", per_node, where)


def _model(a: dict[str, Any], res: ImportResult, where: str, layers: int | None) -> None:
    factory = a.get("factory")
    if factory:
        preset = NEMO_RECIPES.get(str(factory))
        if preset is None:
            raise SpecError(f"{where}: NeMo recipe {factory!r} has no preset here (known: "
                            f"{', '.join(NEMO_RECIPES)}); pass --model")
        res.set("model", preset, where)
        return
    if layers is None and a.get("hidden_size") is None:
        return  # the model is not in these arguments; --model must name it
    hidden = _int(a, "hidden_size", where)
    heads = _int(a, "num_attention_heads", where)
    groups = _int(a, "num_query_groups", where) if _on(a, "group_query_attention") or a.get("num_query_groups") else heads
    ffn = _int(a, "ffn_hidden_size", where) or (4 * hidden if hidden else None)
    vocab = _int(a, "vocab_size", where)
    tok = str(a.get("tokenizer_type") or "")
    if vocab is None and (tok == "GPT2BPETokenizer" or (not tok and a.get("merge_file"))):
        vocab = GPT2_VOCAB  # GPT-2 BPE: vocab file + merges file
    if vocab is None and a.get("tokenizer_model"):
        from trainledger.load.hf import preset_sources

        hit = preset_sources().get(str(a["tokenizer_model"]).lower())
        if hit:
            res.set("model", hit, where)
            return
    swiglu = _on(a, "swiglu") or str(a.get("activation_func", "")).lower() in ("swiglu", "fast-swiglu")
    norm = "rmsnorm" if str(a.get("normalization", "LayerNorm")).lower() == "rmsnorm" else "layernorm"
    bias = not _on(a, "disable_bias_linear") and str(a.get("bias", "true")).lower() != "false"
    pos = str(a.get("position_embedding_type", "learned_absolute")).lower()
    dims = {"num_hidden_layers": layers, "hidden_size": hidden, "num_attention_heads": heads,
            "num_key_value_heads": groups, "intermediate_size": ffn, "vocab_size": vocab,
            "mlp_type": "gated" if swiglu else "plain", "norm_type": norm, "bias": bias,
            "position_embedding": "rope" if pos == "rope" else "learned",
            "tie_word_embeddings": not _on(a, "untie_embeddings_and_output_weights")
            and str(a.get("share_embeddings_and_output_weights", "true")).lower() != "false",
            "max_position_embeddings": _int(a, "max_position_embeddings", where),
            "hidden_act": "silu" if swiglu else "gelu"}
    if a.get("kv_channels") and hidden and heads and int(a["kv_channels"]) != hidden // heads:
        dims["head_dim"] = int(a["kv_channels"])
    label = "--num-layers/--hidden-size/--num-attention-heads/--ffn-hidden-size/--vocab-size"
    if vocab is None:
        raise SpecError(f"{where}: the vocabulary size is not in the arguments (no --vocab-size, and the "
                        "tokenizer is not a known one); add --vocab-size N or pass --model")
    padded = padded_vocab(vocab, _int(a, "make_vocab_size_divisible_by", where) or 128,
                          _int(a, "tensor_model_parallel_size", where) or 1)
    res.set("model", model_from_dims(dims, where, res, label, padded_vocab=padded), where)


def padded_vocab(vocab: int, divisible_by: int, tp: int) -> int:
    """Megatron pads the embedding to a multiple of ``make_vocab_size_divisible_by`` × tp
    (megatron/training/tokenizer/tokenizer.py ``_vocab_size_with_padding``; default 128)."""
    multiple = divisible_by * tp
    return -(-vocab // multiple) * multiple
