"""Row padding of the serving GEMMs: tokens are processed in blocks of the kernels' M tile.

vLLM's fused MoE kernel sorts the routed tokens by expert and pads each expert's share to a
multiple of BLOCK_SIZE_M (``moe_align_block_size``), and its default config uses BLOCK_SIZE_M = 16
whenever there are no more tokens than experts (vllm/model_executor/layers/fused_moe/fused_moe.py
``get_default_config``: ``if M <= E ...: BLOCK_SIZE_M 16``). Marlin's int4 GEMM works on 16-row
activation tiles (Frantar et al. 2024, arXiv:2408.11743, §4). So in the compute-bound regime 1 to
16 rows per expert (or per int4 GEMM) cost one tile, 17 to 32 two.
"""

from __future__ import annotations

import pytest

from trainledger.estimate.serving import ServingPerf
from trainledger.load.plan import PlanInputs, build_plan

TILE_M = 16
K = N = 8192  # wide enough that the tile's compute dominates the activation traffic


def _perf(**kw) -> ServingPerf:
    return ServingPerf(build_plan(PlanInputs(**{"model": "llama-3.1-8b", "method": "inference",
                                                "gpu": "h100-sxm", **kw})))


def test_expert_gemm_rows_are_padded_to_the_fused_moe_block():
    perf = _perf()
    experts = 8

    def t(rows_per_expert: int) -> float:  # no weight bytes: compute against activation traffic only
        return perf._gemm(rows_per_expert * experts, K, N, 0.0, n_mat=experts)

    assert t(1) == pytest.approx(t(TILE_M), rel=1e-3)
    assert t(TILE_M + 1) == pytest.approx(2 * t(TILE_M), rel=1e-3)


def test_int4_gemm_rows_are_padded_to_marlins_tile():
    perf = _perf(quantization="awq")
    assert perf.fmt.dequant

    def t(rows: int) -> float:
        return perf._gemm(rows, K, N, 0.0)

    assert t(1) == pytest.approx(t(TILE_M), rel=1e-3)
    assert t(TILE_M + 1) == pytest.approx(2 * t(TILE_M), rel=1e-3)
