"""Plan = ModelSpec × Recipe × Layout × Cluster: the one argument every estimator takes."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from trainledger.spec.base import Spec
from trainledger.spec.cluster import Cluster
from trainledger.errors import LayoutError, PlanError
from trainledger.spec.layout import Layout
from trainledger.spec.model import ModelSpec
from trainledger.spec.precision import check_precision, check_recipe_method
from trainledger.spec.recipe import Recipe
from trainledger.spec.runtime import (LigerOps, Runtime, dispatcher_problem, liger_ops, liger_stack_problem,
                                      stack_layout_problem)
from trainledger.spec.serving import Serving


#: the parts of a plan, and those each group of its checks reads (``Plan._checked``)
_PARTS = frozenset({"model", "recipe", "layout", "cluster", "runtime", "serving", "headroom"})
_LAYOUT_INPUTS = frozenset({"layout", "cluster", "runtime", "model"})
_SERVING_INPUTS = frozenset({"serving", "model"})
_RECIPE_INPUTS = frozenset({"recipe", "cluster", "model"})
_BATCH_INPUTS = frozenset({"recipe", "layout", "cluster"})
_STACK_INPUTS = frozenset({"recipe", "layout", "cluster", "runtime"})


class Plan(Spec):
    """One concrete job on one concrete cluster under one software stack. The layout is resolved."""

    model: ModelSpec
    recipe: Recipe
    layout: Layout
    cluster: Cluster
    runtime: Runtime = Runtime()
    serving: Serving = Serving()
    headroom: float = Field(0.10, ge=0.0, lt=0.9, description="fraction of memory kept free for the fit verdict")

    @model_validator(mode="after")
    def _resolve(self) -> "Plan":
        return self._checked(_PARTS)

    def _checked(self, changed: frozenset[str]) -> "Plan":
        """The plan's own checks (and its resolved layout, its accumulation from a global batch), in
        order; ``changed``: the parts that may differ from a plan that passed them all (``variant``):
        a group of checks that reads none of them is not run again."""
        if changed & _LAYOUT_INPUTS:
            self._check_layout()
        if changed & _STACK_INPUTS and self.recipe.is_training:
            # a training stack runs only the parallelisms it has (serving engines have their own)
            problem = stack_layout_problem(self.runtime.framework, self.layout)
            if problem is not None:
                raise LayoutError(field=problem[0], message=problem[1])
        if changed & _STACK_INPUTS:
            liger = liger_stack_problem(self.runtime.liger_kernel, self.runtime.framework)
            if liger is not None:
                raise PlanError(field="liger_kernel", message=liger)
            if self.recipe.optimizer_states_dtype not in (None, "fp32") and self.runtime.framework in (
                    "deepspeed", "megatron-deepspeed"):
                raise PlanError(field="optimizer_states_dtype", message=(
                    f"--optimizer-states-dtype {self.recipe.optimizer_states_dtype} with --framework "
                    f"{self.runtime.framework}: DeepSpeed's ZeRO optimizers keep fp32 states (Megatron-Core's "
                    "precision-aware optimizer, or a 16-bit-state AdamW on the PyTorch stacks, keeps 16-bit ones)"))
            dispatch = dispatcher_problem(self.runtime.moe_dispatcher, self.runtime.framework, self.layout.ep,
                                          self.cluster.gpus_per_node)
            if dispatch is not None:
                raise PlanError(field=dispatch[0], message=dispatch[1])
        m = self.model
        if changed & _SERVING_INPUTS and self.serving.quantization == "mxfp4" and m.moe is None:
            raise PlanError(field="quantization", message=
                f"--quantization mxfp4 quantizes the routed experts only (as gpt-oss ships); {m.name} has "
                f"none: use nvfp4, fp8, awq or gptq")
        r = self.recipe
        if changed & _RECIPE_INPUTS:
            if r.capacity_problem:
                raise PlanError(field="moe_pad_to_capacity", message=r.capacity_problem)
            if r.states_problem:
                raise PlanError(field="optimizer_states_dtype", message=r.states_problem)
            check_precision(r.precision, self.cluster.gpu)
            check_recipe_method(r.precision, r.method)
            if r.method in ("lora", "qlora") and m.lora_params(r.lora_targets, r.lora_rank) == 0:
                names = sorted({n.rsplit(".", 1)[-1] for n in m.linear_modules(0)})
                raise PlanError(field="lora_targets", message=
                    f"LoRA targets {', '.join(r.lora_targets)} match no module of {m.name} (as in peft, that "
                    f"is an error); its linear modules are: {', '.join(names)} — pass --lora-targets"
                )
        if changed & _BATCH_INPUTS:
            self._check_batch()
        return self

    def _check_layout(self) -> None:
        lay = self.layout.resolve(self.cluster.world_size)
        lay.validate_world(self.cluster.world_size)
        lay.validate_experts(self.runtime.framework)
        if lay is not self.layout:
            object.__setattr__(self, "layout", lay)
        m, lay = self.model, self.layout
        if m.num_heads % lay.tp:
            raise LayoutError(field="tp", message=
                f"tp={lay.tp} must divide the {m.num_heads} attention heads of {m.name}"
            )
        if lay.pp > m.num_layers:
            raise LayoutError(f"pp={lay.pp} exceeds the {m.num_layers} layers of {m.name}", field="pp")
        if lay.pp * lay.vp > m.num_layers:  # interleaved 1F1B: every virtual stage holds at least one layer
            raise LayoutError(field="vp", message=
                f"pp·vp = {lay.pp}·{lay.vp} = {lay.pp * lay.vp} virtual stages exceed the {m.num_layers} layers "
                f"of {m.name}; use --vp {max(1, m.num_layers // lay.pp)} or less")
        if lay.ep > 1 and (m.moe is None or m.moe.num_experts % lay.ep):
            n = m.moe.num_experts if m.moe else 0
            raise LayoutError(field="ep", message=
                f"ep={lay.ep} needs a MoE model whose experts it divides ({m.name} has {n})"
            )
        if lay.offload == "params" and 0 < lay.zero < 3 and self.runtime.framework in ("hf", "deepspeed",
                                                                                   "megatron-deepspeed"):
            # DeepSpeed's offload_param is "valid only with stage 3" (DeepSpeed configuration JSON docs,
            # zero_optimization.offload_param); ZeRO 1/2 under hf run through DeepSpeed
            raise LayoutError(field="offload", message=
                f"--offload params needs --zero 3: DeepSpeed offloads parameters only with ZeRO stage 3 "
                f"(this plan has --zero {lay.zero} under {self.runtime.framework}); use --offload optimizer or --zero 3")

    def _check_batch(self) -> None:
        r, lay = self.recipe, self.layout
        if r.global_batch is not None:
            per_step = r.micro_batch * lay.dp_size
            if r.global_batch % per_step:
                raise PlanError(field="global_batch", message=
                    f"global batch {r.global_batch} is not a multiple of micro-batch × dp = "
                    f"{r.micro_batch} × {lay.dp_size} = {per_step}; choose a global batch that is a "
                    f"multiple of {per_step} (e.g. {max(per_step, r.global_batch // per_step * per_step)} or "
                    f"{(r.global_batch // per_step + 1) * per_step})"
                )
            ga = r.global_batch // per_step
            if r.grad_accum not in (1, ga):
                raise PlanError(field="grad_accum", message=
                    f"global batch {r.global_batch} != micro-batch × grad-accum × dp = {r.micro_batch} × "
                    f"{r.grad_accum} × {lay.dp_size} = {r.micro_batch * r.grad_accum * lay.dp_size}"
                )
            if ga != r.grad_accum:
                object.__setattr__(self, "recipe", r.model_copy(update={"grad_accum": ga}))
        if self.recipe.seq_len % lay.cp:
            raise LayoutError(f"cp={lay.cp} must divide seq_len={self.recipe.seq_len}", field="cp")

    def variant(self, **parts: Any) -> "Plan":
        """This plan with some of its parts (``recipe``, ``layout``, ``cluster``, ...) replaced by
        other specs of their types, checked as ``Plan(...)`` checks them: ``Plan(...)`` takes such
        specs as they are (pydantic does not validate their fields again), so only the plan's own
        checks (``_resolve``) run (the suggestion search builds a dozen variants per estimate).
        Raises what ``_resolve`` raises (a ``Plan(...)`` call raises them inside a ValidationError
        when they are ValueErrors). ``self`` is a validated plan: the checks that read none of the
        replaced parts passed for it and are not run again."""
        if "headroom" in parts or "model" in parts:
            # a number, not a validated spec; a model spec (Plan(...) runs its own checks again,
            # ModelSpec._check): the whole plan validated
            return Plan(**{**{k: getattr(self, k) for k in type(self).model_fields}, **parts})
        changed = frozenset(k for k, v in parts.items() if v is not getattr(self, k))
        new = self.updated(parts)
        object.__setattr__(new, "__pydantic_fields_set__", set(type(self).model_fields))
        return new._checked(changed)

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step over all data-parallel replicas."""
        r = self.recipe
        if r.global_batch is not None:
            return r.global_batch
        return r.micro_batch * r.grad_accum * self.layout.dp_size

    @property
    def liger(self) -> LigerOps | None:
        """The Liger kernels this plan runs (None without ``--liger-kernel``, or for a model type
        Liger does not patch: ``spec.runtime.liger_ops``)."""
        m = self.model
        return liger_ops(self.runtime.liger_kernel, self.runtime.framework, m.model_type, m.norm_type,
                         m.mlp_type, m.position_embedding, self.layout.tp)

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.recipe.seq_len
