"""verify probe: topology comparison on synthetic matrices, NVLink pairing, host-only runs."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from trainledger.cli import main
from trainledger.verify import probe as P

GIB = 2**30


def matrix(n, default="NV", **pairs):
    """An n×n topology with ``default`` everywhere except pairs given as p0_3='PHB'."""
    m = [["X" if i == j else default for j in range(n)] for i in range(n)]
    for key, lvl in pairs.items():
        i, j = (int(x) for x in key[1:].split("_"))
        m[i][j] = m[j][i] = lvl
    return m


def test_nvlink_plan_flags_the_one_pair_behind_the_host_bridge():
    out = P.compare_topology(matrix(4, p0_3="PHB"), "nvlink", 4)
    assert out == [{"level": "fail", "text": "plan assumes NVLink between GPU0 and GPU3; "
                                             "topology shows the PCIe host bridge (PHB)"}]
    assert P.compare_topology(matrix(4), "nvlink", 4) == []
    # only the plan's GPUs per node are judged
    assert P.compare_topology(matrix(4, p0_3="SYS"), "nvlink", 2) == []


def test_pcie_plan_warns_on_cross_numa_pairs_only():
    m = matrix(4, default="PIX", p0_1="PXB", p0_2="SYS", p1_3="NODE")
    out = P.compare_topology(m, "pcie", 4)
    assert [f["level"] for f in out] == ["warn", "warn"]
    assert "GPU0 and GPU2" in out[0]["text"] and "SYS" in out[0]["text"]
    assert "GPU1 and GPU3" in out[1]["text"] and "NODE" in out[1]["text"]


def gpu(i, bus, links=(), **kw):
    d = {"index": i, "bus_id": bus, "nvlinks": [dict(link=k, active=True, **v) for k, v in enumerate(links)]}
    d.update(kw)
    return d


def test_nvlink_pairs_direct_and_through_switches():
    direct = [gpu(0, "a", [{"remote_bus_id": "b", "remote_type": "gpu"}]),
              gpu(1, "b", [{"remote_bus_id": "a", "remote_type": "gpu"}]), gpu(2, "c")]
    assert P.nvlink_pairs(direct) == {(0, 1)}
    switched = [gpu(i, f"g{i}", [{"remote_bus_id": "sw0", "remote_type": "switch"}]) for i in range(3)]
    switched.append(gpu(3, "g3", [{"remote_bus_id": "sw0", "remote_type": "switch"}]))
    switched[3]["nvlinks"][0]["active"] = False  # GPU3's link is down
    assert P.nvlink_pairs(switched) == {(0, 1), (0, 2), (1, 2)}
    m = P.topology_matrix(4, lambda i, j: "SYS", P.nvlink_pairs(switched))
    assert m[0] == ["X", "NV", "NV", "SYS"] and m[3][1] == "SYS"


def test_pcie_width_and_generation():
    out = P.compare_pcie([gpu(0, "a", pcie_gen=5, pcie_gen_max=5, pcie_width=8, pcie_width_max=16),
                          gpu(1, "b", pcie_gen=1, pcie_gen_max=5, pcie_width=16, pcie_width_max=16),
                          gpu(2, "c", pcie_gen=5, pcie_gen_max=5, pcie_width=16, pcie_width_max=16)])
    assert [(f["level"], f["text"][:4]) for f in out] == [("fail", "GPU0"), ("warn", "GPU1")]


@pytest.mark.parametrize("seen,catalog,ok", [
    ("NVIDIA H100 80GB HBM3", "h100-sxm", True), ("NVIDIA H100 PCIe", "h100-sxm", False),
    ("NVIDIA H100 PCIe", "h100-pcie", True), ("NVIDIA H100 NVL", "h100-nvl", True),
    ("NVIDIA H200", "h100-sxm", False), ("NVIDIA A100-SXM4-80GB", "a100-sxm-80gb", True),
])
def test_gpu_name_matching(seen, catalog, ok):
    assert P.gpu_name_matches(seen, catalog) is ok


PLAN = {"gpu_name": "h100-sxm", "gpu_display_name": "NVIDIA H100 SXM5 80GB", "gpu_memory_bytes": 80 * GIB,
        "gpus_per_node": 4, "intra_kind": "nvlink", "host_ram_bytes": 1024 * GIB, "cpu_cores": 64}


def found(n=4, name="NVIDIA H100 80GB HBM3", mem=80 * GIB, topo=None, ram=1024 * GIB, cores=64):
    gpus = [gpu(i, f"b{i}", name=name, memory_total_bytes=mem) for i in range(n)]
    return {"gpu": {"available": n > 0, "reason": None if n else "no GPU", "gpus": gpus,
                    "topology": topo or matrix(n)},
            "host": {"ram_bytes": ram, "physical_cores": cores}}


def test_compare_with_plan():
    assert P.compare_with_plan(found(), PLAN) == [{"level": "ok", "text": "hardware matches the plan's cluster assumptions"}]
    texts = [f["text"] for f in P.compare_with_plan(found(n=2), PLAN) if f["level"] == "fail"]
    assert texts == ["plan assumes 4 GPU(s) per node; found 2"]
    fails = [f["text"] for f in P.compare_with_plan(found(name="NVIDIA A100-SXM4-40GB", mem=40 * GIB), PLAN)
             if f["level"] == "fail"]
    assert len(fails) == 8 and "GPU0 is NVIDIA A100-SXM4-40GB" in fails[0] and "40.00 GiB" in fails[1]
    out = P.compare_with_plan(found(topo=matrix(4, p1_2="SYS"), ram=512 * GIB, cores=32), PLAN)
    assert [f["level"] for f in out] == ["fail", "warn", "warn"]
    assert "GPU1 and GPU2" in out[0]["text"] and "host RAM" in out[1]["text"] and "32 CPU cores" in out[2]["text"]
    none = P.compare_with_plan(found(n=0), PLAN)
    assert none[0]["level"] == "fail" and "found 0 (no GPU)" in none[0]["text"]


def test_host_only_probe():
    f = P.probe()
    assert f["host"]["logical_cpus"] >= 1 and f["host"]["ram_bytes"] > 0
    if not f["gpu"]["available"]:
        assert f["gpu"]["reason"] and f["gpu"]["gpus"] == []


def test_cli_probe(tmp_path):
    db = str(tmp_path / "l.db")
    r = CliRunner().invoke(main, ["verify", "probe", "--json", "--ledger", db])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output[r.output.index("{"):])
    assert d["ok"] is True and d["findings"] is None and "host" in d
    r = CliRunner().invoke(main, ["verify", "probe", "--gpu", "h100-sxm", "--gpus", "1024", "--gpus-per-node", "8",
                                  "--no-ledger"])  # (more than 8 per node is refused: one NVLink domain)
    assert r.exit_code == 1 and "plan assumes 8 GPU(s) per node" in r.output


def test_cli_require_gpu_without_one(tmp_path):
    if P.probe_gpus()["available"]:
        pytest.skip("a GPU is present")
    r = CliRunner().invoke(main, ["verify", "probe", "--require-gpu", "--no-ledger"])
    assert r.exit_code == 1 and "--require-gpu" in r.output


@pytest.mark.gpu
def test_probe_on_a_gpu():
    g = P.probe_gpus()
    if not g["available"]:
        pytest.skip("no NVIDIA GPU")
    n = len(g["gpus"])
    assert len(g["topology"]) == n and all(row[i] == "X" for i, row in enumerate(g["topology"]))
    assert all(x["memory_total_bytes"] > 0 for x in g["gpus"])


@pytest.mark.parametrize("nvml_name,catalog_name", [
    # names as nvidia-smi / NVML print them
    ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA H200", "h200"), ("NVIDIA A100-SXM4-80GB", "a100-sxm-80gb"),
    ("NVIDIA A100-SXM4-40GB", "a100-sxm-40gb"), ("NVIDIA A100 80GB PCIe", "a100-pcie-80gb"),
    ("NVIDIA H100 NVL", "h100-nvl"), ("NVIDIA GeForce RTX 4090", "rtx-4090"), ("NVIDIA L4", "l4"),
    ("NVIDIA L40S", "l40s"), ("Tesla V100-SXM2-32GB", "v100-sxm2-32gb"), ("NVIDIA RTX A6000", "rtx-a6000"),
    ("NVIDIA Quadro P5000", None),
])
def test_catalog_gpu_for(nvml_name, catalog_name):
    from trainledger.load import catalog

    assert P.catalog_gpu_for(nvml_name, catalog.names("gpus")) == catalog_name
