"""Liger Kernel's ops against transformers' eager ones: predicted vs Liger's published timings.

Liger Kernel publishes its own kernel timings (github:linkedin/Liger-Kernel,
benchmark/data/all_benchmark_data.csv @ 2120862b, rows ``fused_linear_cross_entropy``, mode
``full`` = forward + backward, liger 0.4.2 on an NVIDIA A100-SXM4-80GB, H 4096, V 128256, bf16
weights and inputs): its ``LigerFusedLinearCrossEntropyLoss`` against torch's ``nn.Linear`` +
``nn.CrossEntropyLoss`` on the bf16 logits (benchmark/scripts/benchmark_fused_linear_cross_entropy.py,
``TorchLMHeadCE``: no fp32 upcast). This prints what ``estimate.time.work.head_s`` predicts for the
same shapes: the torch path as the hf stack prices its head GEMMs, with the loss's passes over the
bf16 logits counted for that baseline (log-softmax forward: read 2, write 2; its backward and the
NLL gradient: read 2 + 2, write 2 + 2 = 12 bytes per entry); the Liger path by its chunking (about
V/h chunks, each re-reading the weight and accumulating into the whole bf16 ``grad_weight``).
Second table: a whole gated MLP (LigerGEGLUMLP against transformers' LlamaMLP with gelu_pytorch_tanh,
benchmark/scripts/benchmark_geglu.py; rows ``geglu``, mode ``full``, liger 0.2.1, A100-SXM4-80GB,
bsz 8, h 4096, f 11008, bf16): its three GEMMs (forward, input and weight gradients) as
``efficiency.gemm_time_s`` prices them, plus the activation's streaming bytes per FFN element,
eager (``KERNEL_BYTES['hf']['gated']``) or Liger's (``LIGER_KERNEL_BYTES['gated']``).
Nothing here is fitted: the figures test the mechanism on data it was not built from.

Usage: python bench/liger_kernels.py [--json]
"""

from __future__ import annotations

import json
import sys

from trainledger.estimate.time.efficiency import gemm_time_s
from trainledger.estimate.time.step import _peak16
from trainledger.estimate.time.stack import stack_profile
from trainledger.estimate.time.work import KERNEL_BYTES, LIGER_KERNEL_BYTES, head_s
from trainledger.load.catalog import load_gpu
from trainledger.load.plan import PlanInputs, build_plan

#: (B·T, liger ms, torch ms): Liger's measured medians (file and commit in the module docstring)
MEASURED = [(4096, 121.43, 55.97), (8192, 166.71, 111.45), (16384, 277.12, 220.78), (32768, 511.06, 452.47)]
#: torch's loss on 16-bit logits, bytes per vocabulary entry (module docstring)
TORCH_BF16_XENT_BYTES = 12.0
#: (sequence length, Liger GEGLU MLP ms, transformers LlamaMLP ms), bsz 8, h 4096, f 11008
MLP_MEASURED = [(1024, 30.04, 27.94), (2048, 54.04, 54.51), (4096, 108.52, 110.98), (8192, 216.62, 220.94)]
MLP_BSZ, MLP_H, MLP_F = 8, 4096, 11008


def predict_mlp(tokens: int, liger: bool) -> float:
    """Predicted ms of a gated MLP's forward and backward on an A100-80GB (module docstring)."""
    gpu = load_gpu("a100-sxm-80gb")
    eff = stack_profile("hf", gpu).eff
    peak, hbm = gpu.peak_flop_per_s("bf16"), gpu.hbm_bytes_per_s
    eta = eff.matmul_max("bf16")
    gemms = 2 * gemm_time_s(tokens, MLP_H, MLP_F, peak, hbm, eff, eta, 2.0) \
        + gemm_time_s(tokens, MLP_F, MLP_H, peak, hbm, eff, eta, 2.0)
    fwd, bwd = LIGER_KERNEL_BYTES["gated"] if liger else KERNEL_BYTES["hf"]["gated"]
    return (3 * gemms + tokens * MLP_F * (fwd + bwd) / (hbm * eff.hbm)) * 1e3


def predict(bt: int, liger: bool) -> float:
    """Predicted ms of the head and its loss, forward + backward, for ``bt`` tokens."""
    plan = build_plan(PlanInputs(model="llama-3.1-8b", gpu="a100-sxm-80gb", method="full", precision="bf16",
                                 seq_len=bt, micro_batch=1, liger_kernel=liger))
    prof = stack_profile("hf", plan.cluster.gpu)
    eff = prof.eff
    mm, ew = head_s(plan, bt, eff, _peak16(plan) * prof.clock_scale, eff.matmul_max("bf16"), "hf",
                    None if liger else TORCH_BF16_XENT_BYTES)
    return (mm + ew) * 1e3


def mlp_rows() -> list[dict]:
    out = []
    for s, m_liger, m_hf in MLP_MEASURED:
        t = MLP_BSZ * s
        out.append({"seq_len": s, "liger_ms": m_liger, "liger_pred_ms": predict_mlp(t, True), "hf_ms": m_hf,
                    "hf_pred_ms": predict_mlp(t, False)})
    return out


def rows() -> list[dict]:
    out = []
    for bt, m_liger, m_torch in MEASURED:
        p_liger, p_torch = predict(bt, True), predict(bt, False)
        out.append({"bt": bt, "liger_ms": m_liger, "liger_pred_ms": p_liger, "torch_ms": m_torch,
                    "torch_pred_ms": p_torch, "extra_ms": m_liger - m_torch, "extra_pred_ms": p_liger - p_torch})
    return out


def main(argv: list[str]) -> int:
    data, mlp = rows(), mlp_rows()
    if "--json" in argv:
        print(json.dumps({"flce": data, "geglu_mlp": mlp}, indent=1))
        return 0
    print("lm_head + cross-entropy, fwd+bwd, A100-SXM4-80GB, H 4096, V 128256, bf16 (Liger's measurements)")
    print(f"{'B*T':>6} {'liger ms':>9} {'pred':>7} {'err':>7} {'torch ms':>9} {'pred':>7} {'err':>7} "
          f"{'Liger extra':>11} {'pred':>7}")
    for r in data:
        print(f"{r['bt']:>6} {r['liger_ms']:>9.1f} {r['liger_pred_ms']:>7.1f} {r['liger_pred_ms'] / r['liger_ms'] - 1:>+7.1%} "
              f"{r['torch_ms']:>9.1f} {r['torch_pred_ms']:>7.1f} {r['torch_pred_ms'] / r['torch_ms'] - 1:>+7.1%} "
              f"{r['extra_ms']:>11.1f} {r['extra_pred_ms']:>7.1f}")
    print("\ngated MLP (GeGLU), fwd+bwd, A100-SXM4-80GB, bsz 8, h 4096, f 11008, bf16 (Liger's measurements)")
    print(f"{'seq':>6} {'liger ms':>9} {'pred':>7} {'err':>7} {'hf ms':>9} {'pred':>7} {'err':>7}")
    for r in mlp:
        print(f"{r['seq_len']:>6} {r['liger_ms']:>9.1f} {r['liger_pred_ms']:>7.1f} "
              f"{r['liger_pred_ms'] / r['liger_ms'] - 1:>+7.1%} {r['hf_ms']:>9.1f} {r['hf_pred_ms']:>7.1f} "
              f"{r['hf_pred_ms'] / r['hf_ms'] - 1:>+7.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
