"""Eager-attention inference without autocast (estimate/memory/model.py ``inference``,
EAGER_MASK_BYTES_NO_AUTOCAST): the attention working set per (b, s, ctx) element, measured on CPU.

The prefill's eager attention holds, per (b, s, ctx) element, some bytes per head (scores, their
softmax) plus the mask, shared by all heads. Both are measured here with the repository's tracker
(``trainledger.verify.measure``, storage-exact, CUDA's 512-byte blocks) on a one-layer Llama
built from a config, at two head counts with everything else equal and b·s·ctx = 2·1024² so that
the attention terms dominate the peak: the per-head bytes are the difference of the two peaks,
the mask bytes what is left at zero heads. The estimate is read the same way (the same two plans),
so the test compares mechanisms, not one configuration's total.

What torch 2.13 / transformers 5.x do (masking_utils ``eager_mask``; llama ``eager_attention_forward``):
the additive mask is one c-byte b×1×s×ctx tensor (``torch.where`` on the bool mask, which is
freed); per head the scaled scores (c), the masked scores (c, the scaled ones freed), and
``softmax(..., dtype=float32)``: for c = 2 an fp32 copy of its input (4) and its fp32 output (4),
then ``.to(bf16)`` (2) after the copy is freed, a peak of c + 8 = 10 bytes; for c = 4 no copy,
c + 4 = 8 bytes.

Found while pinning EAGER_MASK_BYTES_NO_AUTOCAST (issue 13 item 9): the estimate's mask term is
7 bytes per element where 2 (bf16) / 4 (fp32) are measured, and its per-head term FP32 + 2c
(8 for bf16, 12 for fp32) where 10 / 8 are measured. On this one-layer model at s = 1024 the
bf16 peak is 26% high at one head, 5% high at two, 6% low at four and 13% low at eight, the fp32
peak 51-59% high at 1-8 heads; the groundtruth row "inference prefill eager" (four heads,
s = 256, two layers) is within 0.1% only because the errors cancel there (with the mask at 9
bytes it is 4.1% high and fails its 3% bound). Marked as a known deviation (strict: it fails the suite once the
model is fixed, so that the marker is removed and the test pins the fixed constants).
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from trainledger.estimate.memory import estimate_memory  # noqa: E402
from trainledger.load.hf import load_hf_config  # noqa: E402
from trainledger.load.plan import PlanInputs, build_plan  # noqa: E402
from trainledger.verify.measure import measure_memory  # noqa: E402

B, S = 2, 1024
#: measured bytes agree with the mechanism to ~0.2 byte per element (the rest of the peak:
#: b·s·h-sized tensors, 512-byte rounding); half a byte separates every candidate mechanism
TOL = 0.5


def _plan(tmp_path, heads: int, precision: str):
    cfg = load_hf_config("tiny-llama-debug")
    for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
        cfg.pop(k, None)
    cfg.update(num_attention_heads=heads, num_key_value_heads=1, head_dim=16, hidden_size=32,
               intermediate_size=32, vocab_size=128, num_hidden_layers=1, max_position_embeddings=4 * S)
    path = tmp_path / f"a{heads}" / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cfg))
    return build_plan(PlanInputs(model=str(path), method="inference", precision=precision, attention="eager",
                                 seq_len=S, micro_batch=B, generate_len=0, serving_engine="hf"))


@pytest.mark.xfail(strict=True, reason="estimate: mask 7 B/element and FP32 + 2c per head; measured c and "
                                       "c + 8 (bf16) / c + 4 (fp32): see the module docstring")
@pytest.mark.parametrize("precision,c,per_head", [("bf16", 2, 10), ("fp32", 4, 8)])
def test_eager_inference_mask_and_per_head_bytes_match_measurement(tmp_path, precision, c, per_head):
    plans = {a: _plan(tmp_path, a, precision) for a in (1, 2)}
    elems = B * S * S
    meas = {a: measure_memory(p, device="cpu", steps=1).peak_allocated_bytes / elems for a, p in plans.items()}
    est = {a: estimate_memory(p, suggest=False).peak_allocated_bytes / elems for a, p in plans.items()}
    m_head, e_head = meas[2] - meas[1], est[2] - est[1]
    m_mask, e_mask = meas[1] - m_head, est[1] - e_head
    # the measurement is what the mechanism above says (guards the measuring itself)
    assert m_head == pytest.approx(per_head, abs=TOL) and m_mask == pytest.approx(c, abs=TOL), (m_head, m_mask)
    assert e_head == pytest.approx(m_head, abs=TOL), f"per-head bytes: estimate {e_head:.2f}, measured {m_head:.2f}"
    assert e_mask == pytest.approx(m_mask, abs=TOL), f"mask bytes: estimate {e_mask:.2f}, measured {m_mask:.2f}"
