"""DeepEP's dispatch and combine: predicted vs DeepEP's published bandwidths.

DeepEP (github:deepseek-ai/DeepEP @ dd758ca) publishes the bandwidth of its normal (training /
prefill) kernels in the DeepSeek-V3 setting: 7168 hidden, 256 experts, top-8, FP8 dispatch (1 byte
per element plus one fp32 scale per 128) and BF16 combine, 8 GPUs and 8 CX7 400 Gb/s NICs per node:

* V1 (docs/legacy.md): H800 (NVLink ~160 GB/s), 4096 tokens per rank; intranode EP 8 and
  internode EP 16/32/64 with group-limited routing (one group per node, ``min(nodes, 4)`` groups per
  token: tests/legacy/test_internode.py).
* V2 (README.md): SM90 + CX7, 8K tokens per rank, EP 8x2 and 8x4. The SM90 part is not named; it
  is priced here as an H100 SXM (full NVLink 4), because on an H800 the NVLink copies alone would
  hold EP 8x2 to about 55 GB/s of logical RDMA bandwidth (the V1 EP 16 row: 43), not the 90 measured.

Its tests define the figures (tests/legacy/test_internode.py, test_intranode.py): internode,
"RDMA bandwidth" = tokens × (nodes a token's experts lie on, its own node included) × bytes per
token / kernel time; intranode, "NVL bandwidth" = tokens received × bytes per token / time. "The
results are logical bandwidth ... [they] contain local rank traffic" (README), so a perfectly
network-bound kernel shows NIC rate / (1 - 1/nodes). This prints what
``estimate.time.dispatch.dispatch_s`` predicts for the same shapes (uniform routing, expected copies
per token, the catalog's H800 NVLink and IB NDR link efficiencies) in the same units. Nothing is
fitted: the kernels' time is the copies over the slower of NVLink and the NICs, plus latency.
The V1 rows also check the H800's own NVLink (200 GB/s per direction, not NVLink 4's 450).

Hybrid-EP (NVIDIA's dispatcher in DeepEP's hybrid-ep branch @ 94a9f8f, docs/README_Hybrid-EP.md)
publishes its own tables, priced here with the same copies (``--moe-dispatcher hybridep``): 4096
tokens per rank, 7168 hidden, 8 local experts per rank (8·EP experts), top-8 routed uniformly at
random without groups (tests/test_hybrid_ep.py), BF16 dispatch and combine, the "Torch API" column
at its largest SM count:

* H100 (8 per node, CX7 400 Gb/s), EP 16/32/64: "IB bandwidth", RDMA bytes as DeepEP's own count
  them (tests/utils.py ``count_rdma_send_from_routing_map``: nodes hit per token, own node included);
* GB200 NVL72, EP 8-36 inside one NVLink domain (MNNVL): NVL bandwidth, tokens received × bytes.

Usage: python bench/deepep_dispatch.py [--json]
"""

from __future__ import annotations

import json
import sys

from trainledger.estimate.time.comm import topology
from trainledger.estimate.time.dispatch import dispatch_s, units_hit
from trainledger.estimate.time.efficiency import link_efficiency
from trainledger.load.plan import PlanInputs, build_cluster
from trainledger.spec.model import MoESpec

HIDDEN, EXPERTS, TOP_K = 7168, 256, 8
#: bytes per token: FP8 with one fp32 scale per 128 elements (the tests' fp8_factor), BF16
FP8_TOKEN, BF16_TOKEN = HIDDEN * (1 + 4 / 128), HIDDEN * 2.0
#: (release, catalog GPU, EP ranks, tokens per rank, dispatch GB/s, combine GB/s), as published
#: (module docstring)
MEASURED = [
    ("v1", "h800", 8, 4096, 153.0, 158.0),
    ("v1", "h800", 16, 4096, 43.0, 43.0),
    ("v1", "h800", 32, 4096, 58.0, 57.0),
    ("v1", "h800", 64, 4096, 51.0, 50.0),
    ("v2", "h100-sxm", 16, 8192, 90.0, 81.0),
    ("v2", "h100-sxm", 32, 8192, 61.0, 61.0),
]


#: Hybrid-EP: (GPU, EP ranks, GPUs per NVLink domain, dispatch GB/s, combine GB/s), BF16, Torch API
#: at 16 SMs (H100) and 32 SMs (GB200), as published (module docstring)
HYBRID_MEASURED = [
    ("h100-sxm", 16, 8, 54.47, 53.35), ("h100-sxm", 32, 8, 47.36, 52.53), ("h100-sxm", 64, 8, 41.24, 46.57),
    ("gb200", 8, 8, 545.71, 568.94), ("gb200", 16, 16, 523.48, 521.55), ("gb200", 24, 24, 507.32, 483.76),
    ("gb200", 32, 32, 484.22, 464.54), ("gb200", 36, 36, 479.02, 447.89),
]


def predict(gpu: str, ep: int, tokens: int, dispatcher: str = "deepep", per_node: int = 8) -> dict[str, float]:
    """Predicted logical bandwidths (GB/s) of one dispatch and one combine: DeepEP's setting (FP8
    dispatch, BF16 combine, 256 experts in one group per node, up to 4 per token) or Hybrid-EP's
    (BF16 both ways, 8 experts per rank routed without groups)."""
    cluster = build_cluster(PlanInputs(gpu=gpu, gpus=ep, network="ib-ndr", gpus_per_node=per_node))
    links = link_efficiency()
    grp = topology(cluster, 1, 1, ep, ep, 1, links).ep
    nodes = grp.nodes
    if dispatcher == "deepep":
        experts, groups, sizes = EXPERTS, (nodes if nodes > 1 else 1), (("dispatch", FP8_TOKEN), ("combine", BF16_TOKEN))
    else:
        experts, groups, sizes = 8 * ep, 1, (("dispatch", BF16_TOKEN), ("combine", BF16_TOKEN))
    moe = MoESpec(num_experts=experts, top_k=TOP_K, expert_intermediate_size=2048,
                  num_groups=groups, topk_groups=min(groups, 4))
    out = {}
    for name, per_token in sizes:
        t = dispatch_s(grp, moe, dispatcher, tokens * per_token, cluster, links)
        if nodes > 1:   # RDMA: tokens × nodes hit (own included) × bytes
            hit = units_hit(experts, nodes, TOP_K, moe.num_groups, moe.topk_groups)
        else:           # NVL: tokens received = tokens × ranks hit (by symmetry)
            hit = units_hit(experts, ep, TOP_K)
        out[name] = tokens * hit * per_token / t / 1e9
        out[name + "_us"] = t * 1e6
    return out


def rows() -> list[dict]:
    out = []
    measured = [(rel, gpu, ep, tokens, disp, comb, "deepep", 8) for rel, gpu, ep, tokens, disp, comb in MEASURED]
    measured += [("hyb", gpu, ep, 4096, disp, comb, "hybridep", per) for gpu, ep, per, disp, comb in HYBRID_MEASURED]
    for rel, gpu, ep, tokens, disp, comb, dispatcher, per_node in measured:
        p = predict(gpu, ep, tokens, dispatcher, per_node)
        out.append({"release": rel, "gpu": gpu, "ep": ep, "tokens": tokens, "link": "NVL" if ep <= per_node else "RDMA",
                    "dispatch_gbps": disp, "dispatch_pred_gbps": p["dispatch"], "dispatch_pred_us": p["dispatch_us"],
                    "combine_gbps": comb, "combine_pred_gbps": p["combine"], "combine_pred_us": p["combine_us"]})
    return out


def main(argv: list[str]) -> int:
    data = rows()
    if "--json" in argv:
        print(json.dumps(data, indent=1))
        return 0
    print("DeepEP normal kernels (v1, v2: 256 experts, FP8 dispatch) and Hybrid-EP (hyb: 8 experts per rank, BF16), "
          "CX7 400 Gb/s per GPU, 7168 hidden, top-8 (the projects' own measurements)")
    print(f"{'rel':>3} {'GPU':>8} {'EP':>3} {'tokens':>6} {'link':>4} {'dispatch':>8} {'pred':>6} {'err':>7} "
          f"{'combine':>8} {'pred':>6} {'err':>7} {'pred us':>14}")
    for r in data:
        print(f"{r['release']:>3} {r['gpu']:>8} {r['ep']:>3} {r['tokens']:>6} {r['link']:>4} {r['dispatch_gbps']:>8.0f} "
              f"{r['dispatch_pred_gbps']:>6.1f} {r['dispatch_pred_gbps'] / r['dispatch_gbps'] - 1:>+7.1%} "
              f"{r['combine_gbps']:>8.0f} {r['combine_pred_gbps']:>6.1f} "
              f"{r['combine_pred_gbps'] / r['combine_gbps'] - 1:>+7.1%} "
              f"{r['dispatch_pred_us']:>6.0f} / {r['combine_pred_us']:<6.0f}")
    print("GB/s are logical (own-node or own-rank traffic included), as DeepEP's tests report them")
    print("hyb rows: priced at dispatcher_efficiency.hybridep (catalog/efficiency/interconnect.yaml), the median of "
          "these rows' measured / link-bound ratios: a consistency check, not a validation")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
