"""Build the real transformers model of a plan: from its config, random weights, never downloaded.

``build_model(hf_config, recipe, device)`` returns a :class:`BuiltModel` whose parameters live

* on the CPU (``device="cpu"``), with real random weights (seeded);
* on the GPU (``device="cuda"``);
* as FakeTensors (``device="fake"``): the model is built on the meta device (no memory, no init)
  and every parameter/buffer is replaced by a CPU FakeTensor of the same shape and dtype, so
  a 70B model's training step can be traced on a laptop. Run the step inside
  ``fake_runtime(built.fake_mode)``.

Remote code is never executed and nothing is downloaded: the config is turned into a
``PretrainedConfig`` with ``AutoConfig.for_model`` and the model with
``AutoModelForCausalLM.from_config``. Dropout probabilities in the config are set to the recipe's
``dropout`` (0 by default). The precision policy decides the parameter dtype (fp32 for ``fp32``
and ``*-mixed``; bf16/fp16 for pure ``bf16``/``fp16``). LoRA is applied with peft
(``LoraConfig(r, lora_alpha, target_modules, lora_dropout=recipe.dropout)``).

Recomputation: ``full`` is Hugging Face gradient checkpointing with ``use_reentrant=False`` on every
decoder layer (or on the first ``recompute_layers`` layers); ``selective`` checkpoints only the
attention core (the function behind ``attn_implementation``), so the s×s scores of eager
attention are recomputed in backward and nothing else is — Korthikanti et al. 2022
(arXiv:2205.05198) §4.2's "selective activation recomputation".
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field
from typing import Any

from trainledger.errors import MissingDependency, VerifyError
from trainledger.spec.recipe import Recipe

INSTALL_HINT = "pip install 'trainledger[verify]'"

#: dtype names of the precision policies (PRECISION_POLICY in recipe.py)
_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def require(module: str) -> Any:
    """Import an optional dependency or raise MissingDependency with the pip command."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingDependency(
            f"trainledger verify needs {module.split('.')[0]}; install it with: {INSTALL_HINT}"
        ) from None


@dataclass
class BuiltModel:
    """A model ready to train, plus what the runner needs to know about it."""

    model: Any
    config: Any
    vocab_size: int
    device: str  # "cpu" | "cuda" | "fake"
    fake_mode: Any = None  # FakeTensorMode (device == "fake"); run inside fake_runtime(fake_mode)
    notes: list[str] = field(default_factory=list)

    @property
    def tensor_device(self) -> str:
        return "cpu" if self.device == "fake" else self.device

    def trainable(self) -> list[Any]:
        return [p for p in self.model.parameters() if p.requires_grad]


def param_dtype(recipe: Recipe) -> Any:
    """torch dtype of the stored weights under the recipe's precision policy."""
    torch = require("torch")
    w = recipe.policy["weights"]
    if recipe.precision == "fp8-mixed":
        raise VerifyError("precision fp8-mixed needs Transformer Engine on a GPU; it cannot be measured "
                          "with plain PyTorch. Measure bf16-mixed instead.")
    return getattr(torch, _DTYPES[w])


def make_config(hf_config: dict[str, Any], recipe: Recipe) -> Any:
    """A transformers PretrainedConfig from a raw config.json mapping (no remote code)."""
    transformers = require("transformers")
    cfg = {k: v for k, v in hf_config.items() if not str(k).startswith("_") and k != "auto_map"}
    if cfg.get("model_type") == "gemma3":  # multimodal: measure the language model, as ModelSpec counts it
        from trainledger.load.hf import text_config

        cfg = text_config(cfg, "config")
    mt = cfg.pop("model_type", None)
    if not mt:
        raise VerifyError("config has no model_type; cannot build the model")
    if mt == "generic":
        raise VerifyError("model_type 'generic' is trainledger's dimension-only config: there is no "
                          "transformers model to run; measure the config.json of a real model family")
    for k in ("torch_dtype", "dtype", "quantization_config"):
        cfg.pop(k, None)
    try:
        config = transformers.AutoConfig.for_model(mt, **cfg)
    except ValueError as exc:
        first = str(exc).split(". ")[0]
        raise VerifyError(f"transformers {transformers.__version__} cannot build model_type {mt!r}: {first}") \
            from None
    for k, v in config.to_dict().items():  # every dropout probability, set or defaulted
        if (k.endswith("dropout") or k.endswith("pdrop")) and isinstance(v, (int, float)) \
                and not isinstance(v, bool) and k != "classifier_dropout":
            setattr(config, k, recipe.dropout)
    config.use_cache = not recipe.is_training
    return config


def attn_implementation(recipe: Recipe, device: str, notes: list[str]) -> str:
    """The transformers attn_implementation that measures the recipe's attention kernel."""
    if recipe.attention == "eager":
        return "eager"
    if recipe.attention in ("flash", "flash1"):
        notes.append("attention=flash is measured with torch SDPA (flash-attn is not used); on CUDA "
                     "SDPA runs its flash kernel for fp16/bf16 inputs")
    elif recipe.attention == "cudnn":
        notes.append("attention=cudnn is measured with torch SDPA's default backend (cuDNN's attention is "
                     "not forced): memory alike, time of SDPA's kernel")
    return "sdpa"


def check_measurable(plan: Any) -> None:
    """Refuse a plan whose model verify would not build as it runs: Liger Kernel's patches are not
    applied here (they need Triton on a CUDA GPU), so a measurement would be of the model's own
    modules, not of the plan."""
    if getattr(plan, "liger", None) is not None:
        raise VerifyError("verify builds the transformers model without Liger Kernel, so it would not measure "
                          "this --liger-kernel plan; record your own Liger run with the Trainer callback "
                          "(trainledger.verify.callbacks.LedgerCallback reads use_liger_kernel), or verify "
                          "without --liger-kernel")

def build_model(hf_config: dict[str, Any], recipe: Recipe, device: str = "cpu", seed: int = 0) -> BuiltModel:
    """Build the model of ``hf_config`` for ``recipe`` on ``device`` (cpu | cuda | fake)."""
    torch = require("torch")
    transformers = require("transformers")
    if device not in ("cpu", "cuda", "fake"):
        raise VerifyError(f"device {device!r} is not one of cpu, cuda, fake")
    if device == "cuda" and not torch.cuda.is_available():
        raise VerifyError("device cuda asked for but torch sees no CUDA GPU; use --device cpu or fake")
    if recipe.method == "qlora":
        _check_qlora(device)
    notes: list[str] = []
    if hf_config.get("model_type") == "gemma3":
        notes.append("gemma3: the language model (text_config) is measured; the vision tower is not built")
    config = make_config(hf_config, recipe)
    attn = attn_implementation(recipe, device, notes)
    dtype = param_dtype(recipe)
    torch.manual_seed(seed)
    where = "meta" if device == "fake" else device
    with torch.device(where):
        model = _from_config(transformers, config, attn, dtype, notes)
    if recipe.is_training:
        model.train()
        _apply_recompute(model, recipe, attn, notes)
    else:
        model.eval()
    if recipe.method in ("lora", "qlora"):
        model = _apply_lora(model, recipe)
    elif not recipe.is_training:
        model.requires_grad_(False)
    fake_mode = None
    if device == "fake":
        fake_mode = _fakeify(model)
    return BuiltModel(model=model, config=config, vocab_size=int(config.vocab_size), device=device,
                      fake_mode=fake_mode, notes=notes)


def _from_config(transformers: Any, config: Any, attn: str, dtype: Any, notes: list[str]) -> Any:
    """AutoModelForCausalLM.from_config; a family without SDPA support falls back to eager."""
    build = transformers.AutoModelForCausalLM.from_config
    try:
        return build(config, attn_implementation=attn, dtype=dtype)
    except ValueError as exc:
        if attn == "sdpa" and "does not support" in str(exc):
            notes.append(f"{config.model_type} has no SDPA attention in transformers: measured with eager "
                         "attention, as transformers runs it by default")
            try:
                return build(config, attn_implementation="eager", dtype=dtype)
            except ValueError as exc2:
                exc = exc2
        raise VerifyError(f"cannot build {config.model_type} as a causal LM: {exc}") from None


def _check_qlora(device: str) -> None:
    if device != "cuda":
        raise VerifyError("method qlora needs bitsandbytes 4-bit kernels on a CUDA GPU; "
                          "measure it with --device cuda")
    require("bitsandbytes")
    raise VerifyError("method qlora is not measured yet: the 4-bit base needs from_pretrained-style "
                      "quantized loading, which this build path does not do")


def _apply_lora(model: Any, recipe: Recipe) -> Any:
    peft = require("peft")
    cfg = peft.LoraConfig(r=recipe.lora_rank, lora_alpha=recipe.lora_alpha,
                          target_modules=list(recipe.lora_targets), lora_dropout=recipe.dropout,
                          task_type="CAUSAL_LM")
    try:
        return peft.get_peft_model(model, cfg)
    except ValueError as exc:
        raise VerifyError(f"LoRA targets {list(recipe.lora_targets)} do not match this model: {exc}") from None


def _apply_recompute(model: Any, recipe: Recipe, attn: str, notes: list[str]) -> None:
    if recipe.recompute == "full":
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x name
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        if recipe.recompute_layers is not None:
            layers = _decoder_layers(model)
            for i, layer in enumerate(layers):
                if i >= recipe.recompute_layers and hasattr(layer, "gradient_checkpointing"):
                    layer.gradient_checkpointing = False
    elif recipe.recompute == "selective":
        name = _register_selective_attention(attn)
        model.set_attn_implementation(name)
        notes.append(f"recompute=selective checkpoints the attention core ({attn}) of every layer")


def _decoder_layers(model: Any) -> list[Any]:
    for mod in model.modules():
        layers = getattr(mod, "layers", None) or getattr(mod, "h", None)
        if layers is not None and hasattr(layers, "__len__") and len(layers) and not isinstance(layers, int):
            return list(layers)
    raise VerifyError("cannot find the decoder layers of this model for recompute_layers")


_SELECTIVE_PREFIX = "trainledger_selective_"


def _register_selective_attention(attn: str) -> str:
    """Register an attention function that wraps ``attn`` in a non-reentrant checkpoint."""
    from torch.utils.checkpoint import checkpoint
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    name = _SELECTIVE_PREFIX + attn

    def selective(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **kwargs: Any) -> Any:
        if attn == "eager":
            fn = sys.modules[type(module).__module__].eager_attention_forward
        else:
            fn = ALL_ATTENTION_FUNCTIONS[attn]

        def core(q: Any, k: Any, v: Any, m: Any) -> Any:
            out, _weights = fn(module, q, k, v, m, **kwargs)
            return out

        return checkpoint(core, query, key, value, attention_mask, use_reentrant=False), None

    AttentionInterface.register(name, selective)
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS._global_mapping[attn])
    return name


def _fakeify(model: Any) -> Any:
    """Replace every meta parameter/buffer by a CPU FakeTensor (shared ones stay shared)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    fake_mode = FakeTensorMode()
    memo: dict[int, Any] = {}
    with fake_mode, contextlib.ExitStack():
        for mod in model.modules():
            for name, p in list(mod._parameters.items()):
                if p is None:
                    continue
                if id(p) not in memo:
                    memo[id(p)] = torch.nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device="cpu"),
                                                     requires_grad=p.requires_grad)
                mod._parameters[name] = memo[id(p)]
            for name, b in list(mod._buffers.items()):
                if b is None:
                    continue
                if id(b) not in memo:
                    memo[id(b)] = torch.zeros(b.shape, dtype=b.dtype, device="cpu")
                mod._buffers[name] = memo[id(b)]
    return fake_mode


@contextlib.contextmanager
def fake_runtime(fake_mode: Any) -> Any:
    """Run a fake model as transformers runs a real one.

    transformers treats FakeTensors as "tracing" (``is_tracing``) and then builds explicit masks
    and repeats K/V heads for SDPA, which an eager run on real tensors does not do. Inside this
    context transformers sees ordinary tensors, and the data-dependent questions it asks
    (``(mask == 0).all()``: is the batch unpadded / unpacked?) are answered by
    :class:`FakeDataDependent` as for our unpadded random batches.
    """
    import transformers.utils.import_utils as iu

    saved = iu.is_fake_tensor
    iu.is_fake_tensor = lambda _t: False
    try:
        with fake_mode, FakeDataDependent():
            yield
    finally:
        iu.is_fake_tensor = saved


def _fake_data_dependent_mode() -> type:
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Mode(TorchDispatchMode):
        """Answer data-dependent scalar reads of fake tensors: all() -> True, any() -> False,
        GradScaler's found_inf -> 0.

        The only reads a decoder's forward makes are "is every token unpadded / is the batch
        unpacked" checks; for the measurement's full, unpadded batches they are ``all(...) ==
        True``. Any other read raises a VerifyError naming the op.
        """

        def __init__(self) -> None:
            super().__init__()
            self._origin: dict[int, str] = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            import torch
            from torch._subclasses.fake_tensor import DataDependentOutputException

            kwargs = kwargs or {}
            if func is torch.ops.aten._local_scalar_dense.default:
                try:
                    return func(*args, **kwargs)
                except DataDependentOutputException:
                    return self._answer(args[0])
            if func is torch.ops.aten._grouped_mm.default and args[0].dtype != torch.bfloat16:
                return self._grouped_mm(func, args, kwargs)
            out = func(*args, **kwargs)
            if func is torch.ops.aten._amp_foreach_non_finite_check_and_unscale_.default:
                self._origin[args[1].untyped_storage()._cdata] = "found_inf"
            name = func._overloadpacket.__name__
            if name in ("all", "any") and isinstance(out, torch.Tensor) and out.dim() == 0:
                self._origin[out.untyped_storage()._cdata] = name
            return out

        @staticmethod
        def _grouped_mm(func: Any, args: tuple, kwargs: dict) -> Any:
            """torch's meta ``_grouped_mm`` accepts only bf16 (the CPU kernel takes any float):
            get the output shape from bf16 stand-ins, return an output of the real dtype."""
            import torch

            a, b = args[0], args[1]
            out = func(a.to(torch.bfloat16), b.to(torch.bfloat16), *args[2:], **kwargs)
            dtype = kwargs.get("out_dtype") or a.dtype
            return torch.empty(out.shape, dtype=dtype, device=a.device)

        def _answer(self, t: Any) -> Any:
            op = self._origin.get(t.untyped_storage()._cdata)
            if op == "all":
                return True
            if op == "any":
                return False
            if op == "found_inf":  # GradScaler: fake gradients are finite
                return 0.0
            raise VerifyError("the model reads a data-dependent value that a fake run cannot know "
                              f"({t.dtype} scalar); measure it with --device cpu or cuda")

    return _Mode


def FakeDataDependent() -> Any:  # noqa: N802 - a mode factory (keeps torch out of import time)
    """A TorchDispatchMode answering data-dependent reads in fake runs (see fake_runtime)."""
    return _fake_data_dependent_mode()()
