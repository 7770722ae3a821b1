"""verify/sharded.py: rank 0 of FSDP2 / DDP on torch's fake process group, checked by hand.

Expected bytes come from the config's shapes (never from the code's output): FSDP2 keeps
ceil(d0/N) rows of every parameter on rank 0 (dim-0 sharding with padding), each storage booked
in CUDA's 512-byte blocks.
"""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from click.testing import CliRunner  # noqa: E402

from trainledger.cli import main  # noqa: E402
from trainledger.errors import VerifyError  # noqa: E402
from trainledger.load.plan import PlanInputs, build_plan  # noqa: E402
from trainledger.verify.sharded import measure_sharded  # noqa: E402

# tiny-llama-debug: h=64, f=176, L=2, a=4, k=2, d=16, V=512, untied
H, F, L, A, K, D, V = 64, 176, 2, 4, 2, 16, 512


def r512(n: int) -> int:
    return 0 if n == 0 else (n + 511) // 512 * 512


def shapes() -> list[tuple[int, int]]:
    """(dim 0, elements per row) of every parameter."""
    layer = [(A * D, H), (K * D, H), (K * D, H), (H, A * D), (F, H), (F, H), (H, F), (H, 1), (H, 1)]
    return [(V, H)] + layer * L + [(H, 1), (V, H)]


def plan(**kw):
    base = dict(model="tiny-llama-debug", gpu="h100-sxm", gpus=8, seq_len=64)
    base.update(kw)
    return build_plan(PlanInputs(**base))


@pytest.mark.parametrize("n", [8, 64])
def test_fsdp2_rank0_holds_padded_dim0_shards(n):
    m = measure_sharded(plan(framework="fsdp2", gpus=n, optimizer="adamw"))
    shards = sum(r512(math.ceil(d0 / n) * row * 4) for d0, row in shapes())
    assert m.categories_at_peak["weights"] == shards
    # foreach AdamW: two fp32 states shaped like each (unpadded) local shard, step counters on the
    # host (fused AdamW, fsdp2's default, adds a step tensor per parameter on the device)
    states = 2 * shards
    assert m.categories_at_peak["optimizer_states"] == states
    assert m.categories_at_peak["sharding_buffers"] > 0  # gathered bf16 parameters
    assert any("FSDP2" in note for note in m.notes)


def test_ddp_bucket_view_gradients_live_in_the_buckets():
    params = sum(d0 * row for d0, row in shapes())
    copy = measure_sharded(plan(gpus=8))
    view = measure_sharded(plan(gpus=8, gradient_as_bucket_view=True))
    # without the view DDP keeps a flat bucket copy of every fp32 gradient besides .grad
    assert copy.phase_peaks["optimizer"] - view.phase_peaks["optimizer"] >= 4 * params * 0.99


def test_deepspeed_is_refused_with_a_reason():
    with pytest.raises(VerifyError, match="DeepSpeed"):
        measure_sharded(plan(framework="deepspeed", zero=2))


def test_verify_memory_cli_measures_a_sharded_plan():
    r = CliRunner().invoke(main, ["verify", "memory", "--model", "tiny-llama-debug", "--gpus", "8", "--framework",
                                  "fsdp2", "--seq-len", "64", "--device", "fake", "--json", "--no-ledger"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["measured"]["env"]["world_size"] == "8"
    assert d["measured"]["categories_at_peak"]["sharding_buffers"] > 0
    assert d["predicted"]["framework"] == "fsdp2"
