"""The serving section of a report (issue 16): engine memory, the throughput-latency curve over
concurrency, and cost and energy per million output tokens. Formatting only: every number comes
from ``Estimate.to_dict()["serving"]``.
"""

from __future__ import annotations

from typing import Any

from trainledger.units import GIB, fmt_seconds
from trainledger.report import charts


def curve_chart(s: dict[str, Any]) -> str:
    """Output tokens/s per GPU against time per output token, one point per concurrency."""
    pts = [{"x": c["tpot_s"] * 1e3, "y": c["output_tokens_per_s_per_gpu"], "label": f"c={c['concurrency']:.0f}",
            "front": True} for c in s.get("curve") or [] if c.get("tpot_s")]
    return charts.scatter("Throughput vs latency over concurrency (continuous batching)", pts,
                          "time per output token, ms", "output tokens/s per GPU",
                          legend=[("c = concurrent sequences", charts.color(1))])


def serving_blocks(s: dict[str, Any]) -> list[tuple]:
    m, a, c = s["memory"], s["at_batch"], s.get("cost") or {}
    kv = [("engine", s["engine_text"]), ("weights", f"{m['weights_bytes'] / GIB:.2f} GiB ({m['weight_format']})"),
          ("KV cache", f"{m['kv_dtype']}, {m['kv_bytes_per_token']:,.0f} bytes per token on one GPU"
                       + (" (MLA latent)" if m["mla_latent"] else "")),
          ("KV pool", f"{m['kv_pool_bytes'] / GIB:.2f} GiB = {m['num_blocks']:,} blocks of {m['block_size']} tokens"),
          ("max concurrency", f"{m['max_concurrency']:.1f} sequences of {m['max_model_len']:,} tokens"),
          ("longest context", f"{m['longest_context']:,} tokens"),
          (f"at concurrency {a['concurrency']:.0f}", f"TTFT {fmt_seconds(a['ttft_s'])}, TPOT {fmt_seconds(a['tpot_s'])}, "
                                                     f"{a['output_tokens_per_s']:,.0f} output tokens/s")]
    for key, label in (("cloud_usd_per_million_output_tokens", "cloud, USD per million output tokens"),
                       ("owned_usd_per_million_output_tokens", "owned, USD per million output tokens"),
                       ("kwh_per_million_output_tokens", "kWh per million output tokens")):
        if key in c:
            kv.append((label, f"{c[key]:,.3f}"))
    rows = [[f"{x['concurrency']:.0f}", fmt_seconds(x["ttft_s"]), fmt_seconds(x["tpot_s"]),
             f"{x['output_tokens_per_s']:,.0f}", f"{x['output_tokens_per_s_per_gpu']:,.0f}", f"{x['requests_per_s']:.2f}"]
            for x in s.get("curve") or []]
    blocks: list[tuple] = [("kv", kv)]
    if rows:
        blocks += [("svg", curve_chart(s)),
                   ("table", ["concurrency", "TTFT", "TPOT", "output tok/s", "per GPU", "req/s"], rows)]
    blocks.append(("list", list(s.get("notes") or []) + ["not modelled: " + "; ".join(s.get("not_modelled") or [])]))
    return blocks
