"""Packed sequences (``--doc-len``): documents packed into one sequence attend only within themselves.

A varlen flash kernel (cu_seqlens: flash-attn's varlen API, Transformer Engine's THD format, NeMo's
packed SFT, TRL's padding-free packing) runs each document's causal attention on its own, so the
attention work per token follows the document length L, not the sequence s: (L+1)/2 keys per query.
A kernel that takes a mask tensor (eager attention, SDPA with ALiBi) still computes every block of
the s×s product. GEMMs, norms and the loss see the same tokens either way.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from trainledger.cli import main
from trainledger.estimate.options import TimeOptions
from trainledger.estimate.time import estimate_compute
from trainledger.estimate.time.compute import step_flops
from trainledger.load.plan import PlanInputs, build_plan


def _plan(**kw):
    base = dict(model="llama-3.1-8b", gpu="h100-sxm", gpus=8, zero=3, seq_len=4096, micro_batch=2)
    base.update(kw)
    return build_plan(PlanInputs(**base))


def test_model_attention_flops_follow_the_document_length_by_hand():
    """Llama-3.1-8B: 32 layers, 32 heads of 128; forward attention core 2·a·(d+d)·keys per token and
    layer, keys (L+1)/2 causal; training runs it 3 times (fwd, 2 in bwd)."""
    s, L = 4096, 256
    whole, packed = step_flops(_plan(seq_len=s)), step_flops(_plan(seq_len=s, doc_len=L))
    tokens = _plan().tokens_per_step
    per_key = 3 * 32 * 2 * 32 * (128 + 128) * tokens  # 3 passes x layers x 2·a·(d_qk + d_v)
    assert whole.model_causal - packed.model_causal == pytest.approx(per_key * ((s + 1) / 2 - (L + 1) / 2),
                                                                     rel=1e-12)
    # the flash kernel executes causal blocks: hardware attention falls by the same amount (x 4/3:
    # the backward recomputes QKᵀ, Dao 2023)
    assert whole.hardware - packed.hardware == pytest.approx(
        (whole.model_causal - packed.model_causal) * 3.5 / 3, rel=1e-12)
    # GEMMs do not change
    assert whole.breakdown["layers"] == packed.breakdown["layers"]


def test_a_mask_tensor_kernel_still_computes_the_whole_sequence():
    whole, packed = step_flops(_plan(attention="eager")), step_flops(_plan(attention="eager", doc_len=256))
    assert packed.model < whole.model          # the work the model needs
    assert packed.hardware == whole.hardware   # the work an eager kernel does
    t_whole = estimate_compute(_plan(attention="eager"), TimeOptions()).step_time_s
    t_packed = estimate_compute(_plan(attention="eager", doc_len=256), TimeOptions()).step_time_s
    assert t_packed == t_whole


def test_packing_shortens_a_flash_step_by_about_its_attention_share():
    t = estimate_compute(_plan(seq_len=16384, micro_batch=1), TimeOptions())
    p = estimate_compute(_plan(seq_len=16384, micro_batch=1, doc_len=512), TimeOptions())
    attn = t.compute_parts["attention"]
    assert attn > 0.2 * t.step_time_s  # long sequences: attention is a large share
    saved = t.step_time_s - p.step_time_s
    # what remains is 512-token attention, well under a tenth of the 16k one
    assert 0.85 * attn < saved < attn


def test_a_document_as_long_as_the_sequence_changes_nothing():
    a, b = _plan(), _plan(doc_len=4096)
    assert estimate_compute(a, TimeOptions()).step_time_s == estimate_compute(b, TimeOptions()).step_time_s
    assert step_flops(_plan(doc_len=10 ** 6)).model == step_flops(a).model


def test_doc_len_is_a_flag_and_reaches_the_plan():
    r = CliRunner().invoke(main, ["estimate", "-m", "llama-3.1-8b", "--gpus", "8", "--zero", "3",
                                  "--seq-len", "8192", "--doc-len", "512", "--json", "--no-ledger"])
    assert r.exit_code == 0, r.output
    assert '"doc_len": 512' in r.output
    bad = CliRunner().invoke(main, ["estimate", "--doc-len", "0", "--no-ledger"])
    assert bad.exit_code != 0 and "doc" in bad.output.lower()


def test_the_planner_plans_packed_fine_tuning():
    """plan --doc-len: the same job on packed 512-token examples at 16k sequences runs faster
    (attention per example), and the job line says so."""
    import json
    args = ["plan", "-m", "llama-3.1-8b", "--method", "full", "--seq-len", "16384", "--tokens", "2B",
            "--deadline-days", "2", "--max-gpus", "16", "--gpu", "h100-sxm", "--top", "1"]
    whole = json.loads(CliRunner().invoke(main, args + ["--json"]).output)
    packed = json.loads(CliRunner().invoke(main, args + ["--json", "--doc-len", "512"]).output)
    assert packed["job"]["doc_len"] == 512 and whole["job"]["doc_len"] is None
    a, b = whole["plans"][0], packed["plans"][0]
    assert (a["gpus"], a["layout"]) == (b["gpus"], b["layout"])
    assert b["estimate"]["tokens_per_s_per_gpu"] > 1.3 * a["estimate"]["tokens_per_s_per_gpu"]
    text = CliRunner().invoke(main, args + ["--doc-len", "512"]).output
    assert "seq 16384 (packed docs of 512)" in text
