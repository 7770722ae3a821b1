"""Text rendering of the serving section (issue 16): reads ``Estimate.to_dict()["serving"]`` only."""

from __future__ import annotations

from typing import Any

from trainledger.units import fmt_seconds, gib
from trainledger.cli.output import table


def serving_lines(s: dict[str, Any]) -> list[str]:
    """The serving section as text: engine memory, latency at the batch, the curve, cost per token."""
    m = s["memory"]
    out = [f"serving — {s['engine_text']}",
           f"  weights {gib(m['weights_bytes']):.2f} GiB ({m['weight_format']}); KV {m['kv_dtype']} "
           f"{m['kv_bytes_per_token']:,.0f} B/token on this GPU"
           f"{' (MLA latent)' if m['mla_latent'] else ''}{' (KV heads replicated over TP)' if m['kv_replicated_over_tp'] and not m['mla_latent'] else ''}",
           f"  KV pool {gib(m['kv_pool_bytes']):.2f} GiB = {m['num_blocks']:,} blocks × {m['block_size']} tokens; "
           f"max concurrency at {m['max_model_len']:,} tokens: {m['max_concurrency']:.1f} sequences "
           f"(runs {m['concurrency']}, max_num_seqs {m['max_num_seqs']}); longest context {m['longest_context']:,} tokens"]
    a = s["at_batch"]
    out.append(f"  at concurrency {a['concurrency']:.0f}: TTFT {fmt_seconds(a['ttft_s'])}, TPOT {fmt_seconds(a['tpot_s'])} "
               f"(worst step {fmt_seconds(a['tpot_worst_s'])}), {a['output_tokens_per_s']:,.0f} output tokens/s "
               f"({a['output_tokens_per_s_per_gpu']:,.0f} per GPU)")
    st = s["static_batch"]
    out.append(f"  static batch: prefill {fmt_seconds(st['ttft_s'])}, then {fmt_seconds(st['tpot_s'])} per token, "
               f"{st['output_tokens_per_s']:,.0f} output tokens/s")
    rows = [[f"{c['concurrency']:.0f}", fmt_seconds(c["ttft_s"]), fmt_seconds(c["tpot_s"]),
             f"{c['output_tokens_per_s']:,.0f}", f"{c['output_tokens_per_s_per_gpu']:,.0f}", f"{c['requests_per_s']:.2f}"]
            for c in s["curve"]]
    out += ["  " + ln for ln in table(rows, ["concurrency", "TTFT", "TPOT", "tok/s", "tok/s/GPU", "req/s"],
                                      align="rrrrrr").splitlines()]
    c = s["cost"]
    parts = []
    if "cloud_usd_per_million_output_tokens" in c:
        parts.append(f"cloud ${c['cloud_usd_per_million_output_tokens']:.3f}")
    if "owned_usd_per_million_output_tokens" in c:
        parts.append(f"owned ${c['owned_usd_per_million_output_tokens']:.3f}")
    if "kwh_per_million_output_tokens" in c:
        parts.append(f"{c['kwh_per_million_output_tokens']:.2f} kWh")
    if parts:
        out.append(f"  per million output tokens at concurrency {c.get('at_concurrency', 0):.0f}: " + ", ".join(parts))
    for n in s.get("notes", []):
        out.append(f"  note: {n}")
    out.append("  not modelled: " + "; ".join(s.get("not_modelled", [])))
    return out
