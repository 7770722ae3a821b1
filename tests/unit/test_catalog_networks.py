"""The link/network catalog: bits vs bytes, per-direction bandwidth, against the standards."""

from __future__ import annotations

import datetime as dt

import pytest

from trainledger.load import catalog
from trainledger.units import gbit_per_s_to_bytes

ALL = catalog.names("networks")

REQUIRED = ["pcie3-x16", "pcie4-x16", "pcie5-x16", "nvlink3", "nvlink4", "nvlink5",
            "ib-edr", "ib-hdr", "ib-ndr", "ib-xdr", "eth-10", "eth-25", "eth-100", "eth-200",
            "eth-400", "roce-100", "roce-200", "roce-400", "infinity-fabric-cdna3", "gaudi3-roce"]


def test_required_networks_exist():
    assert not [n for n in REQUIRED if n not in ALL]


@pytest.mark.parametrize("name", ALL)
def test_every_network_loads_with_source_date_and_one_unit(name):
    n = catalog.load_network(name)
    assert n.source.startswith("https://")
    assert n.checked is not None and n.checked >= dt.date(2026, 11, 29)  # later files carry their own date
    assert (n.gb_per_s is None) != (n.gbit_per_s is None)
    assert 0 < n.latency_s < 1e-3
    # NICs are sold in bits, GPU fabrics in bytes
    if n.kind in ("infiniband", "ethernet", "roce", "gaudi-roce"):
        assert n.gbit_per_s is not None
    else:
        assert n.gb_per_s is not None


def test_bits_are_not_bytes():
    # 400 Gbit/s moves 50e9 bytes/s (a known peer stored it as 400 GB/s: 8x wrong)
    assert gbit_per_s_to_bytes(400) == 50e9
    assert catalog.load_network("ib-ndr").bytes_per_s == 50e9
    assert catalog.load_network("roce-400").bytes_per_s == 50e9
    assert catalog.load_network("eth-100").bytes_per_s == 12.5e9
    assert catalog.load_network("eth-10").bytes_per_s == 1.25e9


@pytest.mark.parametrize("name,gbit", [("ib-edr", 100), ("ib-hdr", 200), ("ib-ndr", 400), ("ib-xdr", 800)])
def test_infiniband_port_rates_follow_the_ibta_roadmap(name, gbit):
    # IBTA roadmap, 4x port data rates: EDR 100, HDR 200, NDR 400, XDR 800 Gbit/s.
    assert catalog.load_network(name).bytes_per_s == pytest.approx(gbit * 1e9 / 8)


@pytest.mark.parametrize("gen,gt_per_s", [(3, 8.0), (4, 16.0), (5, 32.0)])
def test_pcie_x16_from_transfer_rate_and_128b130b_coding(gen, gt_per_s):
    # PCI-SIG base spec: 8 / 16 / 32 GT/s per lane, 128b/130b coding; 16 lanes; per direction.
    expected = gt_per_s * 1e9 * 16 * (128 / 130) / 8
    assert catalog.load_network(f"pcie{gen}-x16").bytes_per_s == pytest.approx(expected, rel=1e-4)


@pytest.mark.parametrize("name,total_bidir_gb", [("nvlink2", 300), ("nvlink3", 600),
                                                  ("nvlink4", 900), ("nvlink5", 1800)])
def test_nvlink_per_direction_is_half_of_nvidias_total(name, total_bidir_gb):
    # NVIDIA NVLink page: total bandwidth per GPU 300 / 600 / 900 / 1800 GB/s (both directions).
    assert catalog.load_network(name).bytes_per_s * 2 == pytest.approx(total_bidir_gb * 1e9)


def test_vendor_fabrics():
    # MI300X datasheet: 7 Infinity Fabric links, 128 GB/s each, 896 GB/s aggregate (both directions).
    assert catalog.load_network("infinity-fabric-cdna3").bytes_per_s * 2 == pytest.approx(896e9)
    # Gaudi 3: 24 x 200GbE on chip, 1200 GB/s both directions; 21 scale-up + 3 scale-out ports.
    up = catalog.load_network("gaudi3-roce").bytes_per_s
    out = catalog.load_network("gaudi3-roce-scaleout").bytes_per_s
    assert (up + out) * 2 == pytest.approx(1200e9)
    assert up == pytest.approx(21 * 200e9 / 8)


def test_scopes_and_ordering_invariants():
    intra = {n.name for n in catalog.all_networks("intra-node")}
    inter = {n.name for n in catalog.all_networks("inter-node")}
    assert intra.isdisjoint(inter) and intra | inter == set(ALL)
    assert {"nvlink4", "pcie5-x16"} <= intra and {"ib-ndr", "eth-100"} <= inter
    # each generation doubles; RDMA beats kernel TCP on latency
    bw = {n: catalog.load_network(n).bytes_per_s for n in ALL}
    assert bw["pcie4-x16"] == pytest.approx(2 * bw["pcie3-x16"], rel=1e-4)
    assert bw["pcie5-x16"] == pytest.approx(2 * bw["pcie4-x16"], rel=1e-4)
    assert bw["nvlink5"] == 2 * bw["nvlink4"]
    assert catalog.load_network("roce-400").latency_s < catalog.load_network("eth-400").latency_s


def test_latencies_are_the_collective_libraries_own_per_step_figures():
    # NCCL src/graph/tuning.cc hwLat (ring, Simple protocol, us per step): NVLink 3.4, PCI 5.7,
    # NET 9.6; RCCL's tuning.cc gives 2.7 for xGMI links.
    expected_us = {"nvlink4": 3.4, "nvlink5": 3.4, "pcie4-x16": 5.7, "ib-ndr": 9.6, "roce-400": 9.6,
                   "infinity-fabric-cdna3": 2.7}
    for name, us in expected_us.items():
        assert catalog.load_network(name).latency_s == pytest.approx(us * 1e-6), name
    for name in ALL:
        assert catalog.load_network(name).latency_source.startswith("https://"), name
