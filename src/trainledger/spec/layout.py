"""Layout: how a job is split over GPUs — DP, TP (+SP), PP, CP, EP, ZeRO/FSDP and offload.

``validate(world_size)`` shows the arithmetic when the degrees do not multiply to the world size.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from trainledger.spec.base import Spec
from trainledger.errors import LayoutError

PipelineSchedule = Literal["1f1b", "interleaved", "gpipe"]
Offload = Literal["none", "optimizer", "params"]


class Layout(Spec):
    """Parallelism degrees and sharding. ``dp=None`` means: whatever the world size leaves."""

    dp: int | None = Field(None, gt=0, le=1_000_000, description="data-parallel degree [gpus / (tp·pp·cp)]")
    tp: int = Field(1, gt=0, le=1024, description="tensor-parallel degree")
    pp: int = Field(1, gt=0, le=1024, description="pipeline-parallel degree")
    cp: int = Field(1, gt=0, le=1024, description="context-parallel degree")
    ep: int = Field(1, gt=0, le=4096, description="expert-parallel degree (within DP×CP; megatron-core: "
                    "within TP×CP×DP, MoE parallel folding)")
    etp: int | None = Field(None, gt=0, le=1024, description="expert tensor-parallel degree, megatron-core "
                            "--expert-tensor-parallel-size [tp]")
    sp: bool = Field(True, description="sequence parallelism with TP (Korthikanti et al. 2022)")
    vp: int = Field(1, gt=0, le=128, description="virtual pipeline stages per rank (interleaved 1F1B)")
    pp_schedule: PipelineSchedule = "1f1b"
    pp_microbatches: int | None = Field(None, gt=0, description="micro-batches per pipeline flush")
    zero: Literal[0, 1, 2, 3] = Field(0, description="ZeRO stage; 3 == FSDP full shard")
    hybrid_shard: bool = Field(False, description="shard within a node, replicate across nodes (HSDP)")
    offload: Offload = Field("none", description="CPU offload of optimizer states, or of params too")
    offload_device: Literal["cpu", "nvme"] = "cpu"

    def model_parallel(self) -> int:
        """GPUs that hold one replica: tp · pp · cp."""
        return self.tp * self.pp * self.cp

    def resolve(self, world_size: int) -> "Layout":
        """Fill in ``dp`` from the world size and check that the degrees multiply to it."""
        mp = self.model_parallel()
        if self.dp is None:
            if world_size % mp:
                worst = max(("tp", "pp", "cp"), key=lambda k: getattr(self, k))
                raise LayoutError(field=worst, message=
                    f"tp·pp·cp = {self.tp}·{self.pp}·{self.cp} = {mp} does not divide {world_size} GPUs; "
                    f"choose degrees whose product divides the GPU count"
                )
            return self.updated({"dp": world_size // mp})  # model_copy(update=...), cheaper
        self.validate_world(world_size)
        return self

    def validate_world(self, world_size: int) -> None:
        dp = self.dp or 1
        total = dp * self.model_parallel()
        if total != world_size:
            raise LayoutError(field="dp", message=
                f"dp·tp·pp·cp = {dp}·{self.tp}·{self.pp}·{self.cp} = {total}, but the cluster has "
                f"{world_size} GPUs; set --dp {world_size // self.model_parallel() or 1} or change --gpus"
            )
        if self.vp > 1 and self.pp == 1:
            raise LayoutError("vp > 1 (interleaved pipeline) needs pp > 1", field="vp")

    def validate_experts(self, framework: str) -> None:
        """Where the expert-parallel ranks come from, per stack.

        Megatron-Core folds MoE parallelism (Liu et al. 2025, "MoE Parallel Folding",
        arXiv:2504.14960, §3; megatron/core/parallel_state.py ``initialize_model_parallel``): the
        expert layers get their own layout ETP × EP × EDP over the same tp·cp·dp ranks of a
        pipeline stage, so EP may exceed DP (drawn from TP and CP ranks too) and the experts may
        use a tensor-parallel degree of their own (``--expert-tensor-parallel-size``, default TP).
        It needs etp·ep to divide tp·cp·dp; EDP = tp·cp·dp / (etp·ep) ranks hold each expert
        shard and share its gradient reduction and distributed-optimizer states. Other stacks
        shard experts over the data-parallel ranks only: ep must divide dp·cp, with the experts
        split over the same tp as the dense layers.
        """
        dp = self.dp or 1
        if framework == "megatron-core":
            etp = self.expert_tp
            ranks = self.tp * self.cp * dp
            if ranks % (etp * self.ep):
                raise LayoutError(field="ep", message=
                    f"etp·ep = {etp}·{self.ep} = {etp * self.ep} must divide tp·cp·dp = {self.tp}·{self.cp}·{dp} = "
                    f"{ranks} (Megatron-Core folds the expert layout ETP×EP×EDP onto the same ranks)")
            return
        if self.etp is not None and self.etp != self.tp:
            raise LayoutError(field="etp", message=
                f"etp={self.etp} differs from tp={self.tp}: a separate expert tensor-parallel degree is "
                f"Megatron-Core's (--framework megatron-core); other stacks split experts over tp")
        if (dp * self.cp) % self.ep:
            raise LayoutError(field="ep", message=
                f"ep={self.ep} must divide dp·cp = {dp}·{self.cp} = {dp * self.cp} (experts are "
                f"sharded over the data-parallel ranks; --framework megatron-core also draws them from tp)"
            )

    @property
    def expert_tp(self) -> int:
        """Tensor-parallel degree of the expert layers (Megatron ETP; tp elsewhere)."""
        return self.etp if self.etp is not None else self.tp

    @property
    def expert_dp(self) -> int:
        """Ranks holding the same expert shard (Megatron EDP = tp·cp·dp / (etp·ep)); with
        ep ≤ dp·cp and etp = tp that is dp·cp / ep."""
        return max(1, self.tp * self.cp * self.dp_size // (self.expert_tp * self.ep))

    @property
    def dp_size(self) -> int:
        if self.dp is None:
            raise LayoutError("layout not resolved: call Layout.resolve(world_size) first")
        return self.dp

    @property
    def zero_shards(self) -> int:
        """Ranks over which ZeRO shards states (the DP group; CP ranks join it as in Megatron)."""
        return self.dp_size * self.cp
