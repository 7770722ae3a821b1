"""MoE token dispatch (``--moe-dispatcher``): the copies per token under an all-to-all and under
DeepEP (github:deepseek-ai/DeepEP @ dd758ca), its buffers, where it is refused, how it is read from
Megatron and torchtitan configs, and the H800's own NVLink bandwidth its kernels run on."""

from __future__ import annotations

import itertools

import pytest

from trainledger.errors import PlanError
from trainledger.estimate import estimate
from trainledger.estimate.memory import estimate_memory
from trainledger.estimate.memory.device import deepep_buffer_bytes
from trainledger.estimate.time import estimate_compute
from trainledger.estimate.time.comm import all_to_all_s, topology
from trainledger.estimate.time.dispatch import dispatch_s, token_copies, units_hit
from trainledger.estimate.time.efficiency import link_efficiency
from trainledger.load.plan import PlanInputs, build_plan
from trainledger.spec.model import MoESpec
from trainledger.estimate.run.fabric import _groups


def _brute_units_hit(E, units, k, G, tg):
    """Expected units hit, enumerating every choice of groups and of experts within them."""
    s, u = E // G, E // units
    total, n = 0.0, 0
    for gs in itertools.combinations(range(G), tg):
        pool = [e for g in gs for e in range(g * s, (g + 1) * s)]
        for ex in itertools.combinations(pool, k):
            total += len({e // u for e in ex})
            n += 1
    return total / n


@pytest.mark.parametrize("E,units,k,G,tg", [
    (16, 4, 3, 4, 2),    # groups = units
    (16, 8, 3, 4, 2),    # a group holds two units
    (16, 2, 3, 4, 2),    # a unit holds two groups
    (12, 3, 2, 6, 3),    # a unit holds two groups, three of six chosen
    (16, 4, 3, 1, 1),    # no group-limited routing
    (12, 4, 4, 3, 3),    # every group chosen: ungrouped
])
def test_units_hit_is_the_enumerated_expectation(E, units, k, G, tg):
    assert units_hit(E, units, k, G, tg) == pytest.approx(_brute_units_hit(E, units, k, G, tg), rel=1e-12)


def test_group_limited_routing_keeps_a_token_within_its_nodes():
    # DeepSeek-V3 (256 experts, 8 groups, 4 per token, top-8) on 8 nodes of 8 ranks: groups are
    # nodes, so a token reaches at most 4 nodes (report §3.2.2), on average fewer
    hit = units_hit(256, 8, 8, 8, 4)
    assert 3.0 < hit < 4.0
    assert units_hit(256, 8, 8) > 5.0   # the same routing without groups


def test_alltoall_sends_one_copy_per_routed_expert():
    moe = MoESpec(num_experts=64, top_k=6, expert_intermediate_size=1024)
    c = token_copies(moe, 32, 8, "alltoall")
    assert c.nvlink == pytest.approx(6 * 7 / 32)
    assert c.network == pytest.approx(6 * 24 / 32)


def test_deepep_copies_are_ranks_and_nodes_hit():
    # one copy per target rank (less the 1/g that are the sender or the forwarder) and one per
    # remote node
    moe = MoESpec(num_experts=256, top_k=8, expert_intermediate_size=2048, num_groups=8, topk_groups=4)
    c = token_copies(moe, 64, 8, "deepep")
    assert c.nvlink == pytest.approx(units_hit(256, 64, 8, 8, 4) * 7 / 8)
    assert c.network == pytest.approx(units_hit(256, 8, 8, 8, 4) * 7 / 8)


def _ep_group(gpu="h100-sxm", ep=64, gpus=None):
    plan = build_plan(PlanInputs(model="deepseek-v3", gpu=gpu, gpus=gpus or ep, ep=ep, framework="megatron-core"))
    links = link_efficiency()
    return plan, topology(plan.cluster, 1, 1, ep, ep, 1, links).ep, links


def test_top1_routing_sends_the_same_under_both_dispatchers():
    # with one expert per token there is nothing to deduplicate: inside a node both send each token
    # once to its rank
    plan, grp, links = _ep_group(ep=8)
    moe = MoESpec(num_experts=64, top_k=1, expert_intermediate_size=1024)
    a = dispatch_s(grp, moe, "alltoall", 1e8, plan.cluster, links)
    d = dispatch_s(grp, moe, "deepep", 1e8, plan.cluster, links)
    assert d == pytest.approx(a, rel=1e-9)


def test_alltoall_dispatch_is_the_all_to_all_of_k_copies():
    plan, grp, links = _ep_group(ep=64)
    moe = plan.model.moe
    assert dispatch_s(grp, moe, "alltoall", 1e8, plan.cluster, links) == \
        all_to_all_s(grp, 1e8 * moe.top_k, plan.cluster, links)


def test_deepep_halves_deepseek_v3_network_time_or_better():
    # 7 network copies per token under the all-to-all, about 3.2 under DeepEP: network-bound both
    plan, grp, links = _ep_group(ep=64)
    moe = plan.model.moe
    a = dispatch_s(grp, moe, "alltoall", 1e9, plan.cluster, links)
    d = dispatch_s(grp, moe, "deepep", 1e9, plan.cluster, links)
    assert 0.4 < d / a < 0.5


def _dsv3(dispatcher, **kw):
    args = dict(model="deepseek-v3", gpu="h800", gpus=2048, pp=16, vp=3, ep=64, dp=128, zero=1,
                framework="megatron-core", precision="fp8-mixed", seq_len=4096, global_batch=15360,
                moe_dispatcher=dispatcher)
    args.update(kw)
    return build_plan(PlanInputs(**args))


def test_deepep_shortens_the_exposed_all_to_all_only():
    a, d = estimate_compute(_dsv3("alltoall")), estimate_compute(_dsv3("deepep"))
    assert d.breakdown["compute"] == a.breakdown["compute"]
    assert d.breakdown["comm_ep"] < 0.5 * a.breakdown["comm_ep"]
    assert any("DeepEP" in n for n in d.notes)
    assert any("--moe-dispatcher deepep" in n for n in a.notes)   # the all-to-all's note points at it


def test_fabric_bytes_follow_the_copies():
    a, d = _groups(_dsv3("alltoall"))["ep"][0], _groups(_dsv3("deepep"))["ep"][0]
    c = token_copies(_dsv3("deepep").model.moe, 64, 8, "deepep")
    assert d / a == pytest.approx(c.total / (8 * 63 / 64))
    mix = dict(model="mixtral-8x7b", gpus=16, ep=8, framework="megatron-core")
    a = _groups(build_plan(PlanInputs(**mix)))["ep"][0]
    g = _groups(build_plan(PlanInputs(**mix, moe_dispatcher="allgather")))["ep"][0]
    assert g / a == pytest.approx(7 / (2 * 7 / 8))   # every other rank against top-2 of 8


def test_deepep_buffer_from_its_size_hints():
    # csrc/legacy/config.hpp with Buffer.num_sms 20 (10 channels), 7168 hidden in bf16
    # (14336 bytes per token): per token slot 14336 + 8 (SourceMeta) + 128·8 (top-k idx) +
    # 128·4 (weights) + 128·4 (scales) = 16392
    # EP 8: one node, NVLink buffer only: 10 ch · 8 ranks · ((2·1+3)·4 + 256 tokens · 16392), to 128
    nvl8 = 10 * 8 * (5 * 4 + 256 * 16392)
    assert deepep_buffer_bytes(8, 7168, 2) == -(-nvl8 // 128) * 128
    # EP 64: 8 RDMA ranks; NVLink 288 tokens; RDMA: 128 tokens (a multiple of the 8-token chunk),
    # both directions, + an int4 per token
    nvl = 10 * 8 * ((2 * 8 + 3) * 4 + 288 * 16392)
    rdma = 10 * 8 * ((8 * 2 + 2) * 2 * 4 + 128 * 2 * (16392 + 16))
    assert deepep_buffer_bytes(64, 7168, 2) == -(-nvl // 128) * 128 + -(-rdma // 128) * 128
    # EP 16 dispatch: 20-token RDMA chunks, 128 receive slots rounded up to 140
    rdma16 = 10 * 2 * ((8 * 2 + 2) * 2 * 4 + 140 * 2 * (16392 + 16))
    nvl16 = 10 * 8 * ((2 * 2 + 3) * 4 + 288 * 16392)
    assert deepep_buffer_bytes(16, 7168, 2) == -(-nvl16 // 128) * 128 + -(-rdma16 // 128) * 128
    assert deepep_buffer_bytes(1, 7168, 2) == 0


def test_deepep_buffers_are_on_the_device_not_allocated():
    a, d = estimate_memory(_dsv3("alltoall")), estimate_memory(_dsv3("deepep"))
    assert d.peak_allocated_bytes == a.peak_allocated_bytes
    buf = deepep_buffer_bytes(64, 7168, 2)
    assert d.runtime_terms["comm_buffers"] == buf
    assert d.device_total_bytes - a.device_total_bytes == buf
    assert "comm_buffers" not in a.runtime_terms


def test_deepep_refused_where_it_cannot_run():
    with pytest.raises(PlanError) as e:
        build_plan(PlanInputs(model="deepseek-v3", gpus=64, ep=8, framework="deepspeed", moe_dispatcher="deepep"))
    assert e.value.field == "moe_dispatcher"
    with pytest.raises(PlanError) as e:
        build_plan(PlanInputs(model="deepseek-v3", gpus=256, ep=256, framework="fsdp2", moe_dispatcher="deepep"))
    assert e.value.field == "ep"
    with pytest.raises(PlanError) as e:   # internode DeepEP pairs 8 NVLink peers per node
        build_plan(PlanInputs(model="deepseek-v3", gpus=64, gpus_per_node=4, ep=16, framework="fsdp2",
                              moe_dispatcher="deepep"))
    assert e.value.field == "moe_dispatcher" and "8-GPU nodes" in str(e.value)
    build_plan(PlanInputs(model="deepseek-v3", gpus=64, gpus_per_node=4, ep=4, framework="fsdp2",
                          moe_dispatcher="deepep"))   # inside a node: any node size
    with pytest.raises(PlanError):   # 8 ranks over two 4-GPU nodes: no NVLink between them
        build_plan(PlanInputs(model="deepseek-v3", gpus=64, gpus_per_node=4, ep=8, framework="fsdp2",
                              moe_dispatcher="deepep"))
    # a dense model: a note, no effect
    p = build_plan(PlanInputs(model="llama-3.1-8b", framework="fsdp2", moe_dispatcher="deepep"))
    assert any("no effect" in n for n in estimate_compute(p).notes)


def test_h800_runs_its_own_nvlink():
    # H800 SXM5: NVLink cut to 400 GB/s both directions (datasheet), 200 per direction, not NVLink
    # 4's 450; the planner's clusters the same
    from trainledger.planner.candidates import cluster_for
    from trainledger.load.catalog import load_gpu, load_network

    p = build_plan(PlanInputs(model="llama-3.1-8b", gpu="h800", gpus=8))
    assert p.cluster.intra.bytes_per_s == pytest.approx(200e9)
    assert build_plan(PlanInputs(model="llama-3.1-8b", gpu="h100-sxm", gpus=8)).cluster.intra.bytes_per_s == \
        pytest.approx(450e9)
    c = cluster_for(load_gpu("h800"), 8, 16, load_network("ib-ndr"))
    assert c.intra.bytes_per_s == pytest.approx(200e9)


def test_estimate_json_states_the_dispatcher():
    est = estimate(_dsv3("deepep"))
    assert est.plan.runtime.summary()["moe_dispatcher"] == "deepep"
    assert "moe_dispatcher" not in _dsv3("alltoall").runtime.summary()


# ----------------------------------------------------------------------------- importers
_MEGATRON = ("torchrun --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size 1 --num-layers 4 "
             "--hidden-size 1024 --ffn-hidden-size 4096 --num-attention-heads 16 --seq-length 2048 "
             "--max-position-embeddings 2048 --vocab-size 32000 --micro-batch-size 1 --global-batch-size 64 --bf16 "
             "--num-experts 16 --moe-router-topk 2 --expert-model-parallel-size 8 {extra}\n")


@pytest.mark.parametrize("extra,want,noted", [
    ("--moe-token-dispatcher-type flex --moe-enable-deepep", "deepep", False),
    ("--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep", "deepep", False),
    ("--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep", "hybridep", False),
    ("--moe-token-dispatcher-type flex --moe-enable-hybridep", "hybridep", False),
    ("--moe-token-dispatcher-type alltoall", "alltoall", False),
    ("", "allgather", False),   # Megatron's default
])
def test_megatron_dispatcher_flags(tmp_path, extra, want, noted):
    from trainledger.runconfig import import_configs

    p = tmp_path / "run.sh"
    p.write_text(_MEGATRON.format(extra=extra))
    res = import_configs([p])
    assert res.merged().get("moe_dispatcher") == want
    assert any("dispatcher" in n or "hybridep" in n for n in res.notes) == noted
    assert not any("dispatcher" in u or "deepep" in u for u in res.unknown_keys)


@pytest.mark.parametrize("backend,want", [("deepep", "deepep"), ("hybridep", "hybridep"), ("standard", None)])
def test_torchtitan_ep_comm_backend(tmp_path, backend, want):
    from trainledger.runconfig import import_configs

    p = tmp_path / "t.toml"
    p.write_text('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nseq_len = 2048\n[parallelism]\n'
                 f'expert_parallel_degree = 8\nexpert_parallel_comm_backend = "{backend}"\n')
    res = import_configs([p])
    assert res.merged().get("moe_dispatcher") == want
    assert not any("expert_parallel_comm_backend" in u for u in res.unknown_keys)


# ----------------------------------------------------------------------------- allgather
def test_allgather_moves_every_token_to_every_rank_whatever_the_routing():
    # Megatron's MoEAllGatherTokenDispatcher: all-gather of the group's tokens, then reduce-scatter:
    # the ring all-gather of n × the rank's bytes, with no routing-imbalance share
    from trainledger.estimate.time.comm import all_gather_s

    plan, grp, links = _ep_group(ep=16, gpus=16)
    moe = plan.model.moe
    t = dispatch_s(grp, moe, "allgather", 1e8, plan.cluster, links, imbalance=1.3)
    assert t == all_gather_s(grp, 16 * 1e8)
    assert token_copies(moe, 16, 8, "allgather").total == 15
    # top-2 of 8 experts inside one node (Mixtral): 7 NVLink copies against the all-to-all's 1.75
    plan8, grp8, _ = _ep_group(ep=8)
    top2 = MoESpec(num_experts=8, top_k=2, expert_intermediate_size=14336)
    ag = dispatch_s(grp8, top2, "allgather", 1e8, plan8.cluster, links)
    a2a = dispatch_s(grp8, top2, "alltoall", 1e8, plan8.cluster, links)
    assert 3.0 < ag / a2a < 4.5


def test_allgather_only_under_megatron_core_and_noted():
    with pytest.raises(PlanError) as e:
        build_plan(PlanInputs(model="mixtral-8x7b", gpus=8, ep=8, framework="fsdp2", moe_dispatcher="allgather"))
    assert e.value.field == "moe_dispatcher"
    p = build_plan(PlanInputs(model="mixtral-8x7b", gpus=16, ep=8, framework="megatron-core",
                              moe_dispatcher="allgather"))
    c = estimate_compute(p)
    assert any("all-gather" in n for n in c.notes)
    a = estimate_compute(p.model_copy(update={"runtime": p.runtime.model_copy(update={"moe_dispatcher": "alltoall"})}))
    assert c.breakdown["comm_ep"] > a.breakdown["comm_ep"]   # top-2 of 8: 7 copies against 1.75


# ----------------------------------------------------------------------------- Hybrid-EP
def test_hybridep_prices_deepeps_copies_at_its_own_share_of_the_links():
    """Hybrid-EP makes DeepEP's copies (per destination rank over NVLink, per destination node over
    the network) at dispatcher_efficiency.hybridep of the link rates; the latency is the same."""
    from trainledger.estimate.time.comm import topology
    from trainledger.estimate.time.dispatch import dispatch_s, token_copies
    from trainledger.estimate.time.efficiency import link_efficiency

    plan = _dsv3("deepep")
    links = link_efficiency()
    grp = topology(plan.cluster, 1, 1, 64, 64, 1, links).ep
    moe = plan.model.moe
    assert token_copies(moe, 64, 8, "hybridep") == token_copies(moe, 64, 8, "deepep")
    eff = links.dispatcher_efficiency("hybridep")
    assert 0.5 < eff < 1.0 and links.dispatcher_efficiency("deepep") == 1.0
    lat = grp.ring_latency(grp.nodes - 1 + grp.per_node - 1, grp.nodes - 1)
    d = dispatch_s(grp, moe, "deepep", 1e8, plan.cluster, links) - lat
    h = dispatch_s(grp, moe, "hybridep", 1e8, plan.cluster, links) - lat
    assert h == pytest.approx(d / eff, rel=1e-12)


def test_hybridep_runs_where_deepep_is_refused_and_holds_no_deepep_buffer():
    from trainledger.errors import TrainledgerError
    from trainledger.estimate import estimate

    # an EP group inside one NVL72 rack: DeepEP's kernels pair 8 NVLink peers, Hybrid-EP spans the domain
    kw = dict(model="deepseek-v3", gpu="gb200", gpus=64, gpus_per_node=64, ep=64, framework="megatron-core",
              zero=1, seq_len=4096)
    with pytest.raises(TrainledgerError, match="hybridep"):
        build_plan(PlanInputs(**kw, moe_dispatcher="deepep"))
    est = estimate(build_plan(PlanInputs(**kw, moe_dispatcher="hybridep")))
    assert "comm_buffers" not in {t.name for t in est.memory.terms}
    assert any("Hybrid-EP" in n and "not in the memory" in n for n in est.compute.notes)
    # all copies stay on NVLink, one per target rank (fewer than the all-to-all's one per routed expert)
    from trainledger.estimate.time.dispatch import token_copies

    c, a = token_copies(est.plan.model.moe, 64, 64, "hybridep"), token_copies(est.plan.model.moe, 64, 64, "alltoall")
    assert c.network == 0 and a.network == 0 and c.nvlink < a.nvlink
    # any EP size (JIT-compiled kernels), where DeepEP has configs for some only
    assert build_plan(PlanInputs(**{**kw, "gpus": 8, "gpus_per_node": 8, "ep": 8}, moe_dispatcher="hybridep"))
