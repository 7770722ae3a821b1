"""GpuSpec / NetworkSpec / Cluster behaviour: dtype fallbacks, validation in Python, the CLI views."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from pydantic import ValidationError

from trainledger.load import catalog
from trainledger.spec.cluster import Cluster, GpuSpec
from trainledger.errors import CatalogError


def test_cluster_from_catalog_parts():
    gpu = catalog.load_gpu("h100-sxm")
    c = Cluster(gpu=gpu, gpus_per_node=8, nodes=4, intra=catalog.load_network(gpu.link),
                inter=catalog.load_network("ib-ndr"))
    assert c.world_size == 32
    assert c.intra.bytes_per_s == 450e9       # NVLink 4: 900 GB/s both directions
    assert c.inter.bytes_per_s == 50e9        # NDR: 400 Gbit/s


def test_dtype_fallbacks_follow_the_unit_that_runs_them():
    v100 = catalog.load_gpu("v100-sxm2-32gb")
    assert not v100.has_native("bf16") and v100.has_native("fp16")
    assert v100.peak_flop_per_s("bf16") == v100.peak_flop_per_s("fp16") == 125e12
    assert v100.peak_flop_per_s("fp8") == 125e12          # no fp8 tensor cores: 16-bit rate
    assert v100.peak_flop_per_s("tf32") == 15.7e12         # no tf32: plain fp32
    a100 = catalog.load_gpu("a100-sxm-80gb")
    assert a100.peak_flop_per_s("fp8") == a100.peak_flop_per_s("bf16")
    gaudi = catalog.load_gpu("gaudi3")
    with pytest.raises(CatalogError, match="no fp32 throughput"):
        gaudi.peak_flop_per_s("fp32")
    with pytest.raises(CatalogError, match="unknown compute dtype"):
        gaudi.peak_flop_per_s("fp4")


def test_gpu_spec_built_in_python_is_validated_too():
    fields = catalog.load_gpu("a10").model_dump() | {"bf16_tflops": 10.0}
    with pytest.raises(ValidationError, match="bf16_tflops"):
        GpuSpec.model_validate(fields)
    ok = GpuSpec.model_validate(catalog.load_gpu("a10").model_dump())
    assert ok == catalog.load_gpu("a10")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainledger", *args], capture_output=True,
                          text=True, timeout=120)


def test_cli_gpus_and_networks_json():
    out = _cli("gpus", "--json")
    assert out.returncode == 0, out.stderr
    gpus = {g["name"]: g for g in json.loads(out.stdout)["gpus"]}
    assert len(gpus) >= 22
    # the CUDA total: nvidia-smi's 81559 MiB less the driver's reserve (79.21 GiB in torch's OOM text)
    assert gpus["h100-sxm"]["usable_bytes"] == round(79.21 * 2**30)
    assert gpus["h100-sxm"]["memory_bytes"] == 81559 * 2**20
    assert gpus["h100-sxm"]["bf16_tflops"] == pytest.approx(989.5)
    amd = json.loads(_cli("gpus", "--vendor", "amd", "--json").stdout)["gpus"]
    assert {g["vendor"] for g in amd} == {"amd"}
    nets = {n["name"]: n for n in json.loads(_cli("networks", "--json").stdout)["networks"]}
    assert nets["ib-ndr"]["bytes_per_s"] == 50e9 and nets["ib-ndr"]["gbit_per_s"] == 400


def test_cli_tables_and_bad_vendor():
    text = _cli("gpus").stdout
    assert "h100-sxm" in text and "989.5" in text and "dense" in text
    assert "400 Gbit/s (50 GB/s)" in _cli("networks").stdout
    bad = _cli("gpus", "--vendor", "acme")
    assert bad.returncode != 0
    assert bad.stderr.strip().startswith("error: unknown vendor") and "Traceback" not in bad.stderr
