"""Bad input to the hardware catalog: did-you-mean, user files, malformed files -> one clear line."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from trainledger.load import catalog
from trainledger.errors import CatalogError, SpecError

GPU_DIR = Path(catalog.__file__).parents[1] / "catalog" / "gpus"


def _h100_fields() -> dict:
    return yaml.safe_load((GPU_DIR / "h100-sxm.yaml").read_text())


def _write(tmp_path: Path, fields: dict, name: str = "my-gpu.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(fields))
    return p


def _error(tmp_path: Path, **changes) -> str:
    fields = _h100_fields() | changes
    fields = {k: v for k, v in fields.items() if v is not None}
    path = _write(tmp_path, fields)
    with pytest.raises(SpecError) as info:
        catalog.load_gpu(str(path))
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(str(path))
    return msg


@pytest.mark.parametrize("typed,expected", [
    ("h100", {"h100-sxm", "h100-pcie", "h100-nvl"}),
    ("a100", {"a100-sxm-40gb", "a100-sxm-80gb", "a100-pcie-40gb", "a100-pcie-80gb"}),
    ("h100sxm", {"h100-sxm"}),
    ("MI300", {"mi300x"}),
])
def test_unknown_gpu_suggests_the_closest_names(typed, expected):
    with pytest.raises(CatalogError) as info:
        catalog.load_gpu(typed)
    msg = str(info.value)
    assert "Did you mean" in msg and "trainledger gpus" in msg
    for name in expected:
        assert name in msg


def test_unknown_network_suggests():
    with pytest.raises(CatalogError, match="ib-ndr"):
        catalog.load_network("ndr")


def test_user_gpu_file_works_where_a_name_does(tmp_path):
    fields = _h100_fields() | {"display_name": "My tuned H100", "tdp_w": 500}
    path = _write(tmp_path, fields, "lab-h100.yaml")
    g = catalog.load_gpu(str(path))
    assert g.name == "lab-h100" and g.tdp_w == 500
    assert g.peak_flop_per_s("bf16") == catalog.load_gpu("h100-sxm").peak_flop_per_s("bf16")


def test_minimal_user_gpu_file(tmp_path):
    # the fields a user must give; memory_bytes defaults to memory_gb read as GiB
    p = tmp_path / "lab.yaml"
    p.write_text("display_name: Lab card\nvendor: nvidia\narchitecture: Ada Lovelace\n"
                 "form_factor: PCIe\nmemory_gb: 48\nmemory_type: GDDR6\nhbm_tb_per_s: 0.96\n"
                 "bf16_tflops: 364.2\nlink: pcie4-x16\nlink_gb_per_s: 25\ntdp_w: 300\n"
                 "source: our own measurement\n")
    g = catalog.load_gpu(str(p))
    assert g.memory_bytes == 48 * 2**30 and g.memory_bytes_basis == "stated"
    assert g.peak_flop_per_s("fp16") == 364.2e12


def test_user_gpu_file_may_name_its_own_link_file(tmp_path):
    net = yaml.safe_load((GPU_DIR.parent / "networks" / "nvlink3.yaml").read_text())
    (tmp_path / "nvlink-a800.yaml").write_text(yaml.safe_dump(net | {"gb_per_s": 200}))
    fields = yaml.safe_load((GPU_DIR / "a100-sxm-80gb.yaml").read_text())
    fields |= {"display_name": "A800 80GB", "link": "nvlink-a800.yaml", "link_gb_per_s": 200}
    # nvlink_generation is not checked against a file name (only against nvlinkN catalog names)
    g = catalog.load_gpu(str(_write(tmp_path, fields, "a800.yaml")))
    assert g.link_bytes_per_s == 200e9
    assert catalog.load_network(g.link).bytes_per_s == 200e9   # from any working directory


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(CatalogError, match="no such file"):
        catalog.load_gpu(str(tmp_path / "nope.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("memory_gb: [80\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        catalog.load_gpu(str(bad))
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n")
    with pytest.raises(SpecError, match="expected a mapping"):
        catalog.load_gpu(str(listy))


@pytest.mark.parametrize("changes,field", [
    ({"bf16_tflops": 1979 / 100}, "bf16_tflops"),          # below fp32: a vector figure, not tensor
    ({"fp8_tflops": 500}, "fp8_tflops"),                    # below bf16
    ({"memory_bytes": 40 * 2**30}, "memory_bytes"),         # not within 10% of 80 GB
    ({"memory_gb": -80}, "memory_gb"),
    ({"memory_gb": 10**9}, "memory_gb"),                     # absurd size
    ({"tdp_w": "lots"}, "tdp_w"),
    ({"hbm_tb_per_s": 3350}, "hbm_tb_per_s"),               # GB/s typed into a TB/s field
    ({"link": "nvlink9"}, "link"),
    ({"link": "ib-ndr"}, "link"),                            # an inter-node network
    ({"link_gb_per_s": 900}, "link_gb_per_s"),              # both directions typed as one
    ({"nvlink_generation": 3}, "nvlink_generation"),        # does not match nvlink4
    ({"vendor": "acme"}, "vendor"),
    ({"source": ""}, "source"),
    ({"bf16_tflop": 989}, "bf16_tflop"),                    # misspelled field is not dropped silently
    ({"memory_source": None, "memory_bytes_basis": "reported"}, "memory_source"),
    ({"display_name": None}, "display_name"),               # required
])
def test_malformed_gpu_file_names_file_and_field(tmp_path, changes, field):
    assert field in _error(tmp_path, **changes)


def test_unknown_link_error_suggests_networks(tmp_path):
    msg = _error(tmp_path, link="nvlink")
    assert "Did you mean" in msg and "nvlink4" in msg


def test_network_file_needs_exactly_one_unit(tmp_path):
    net = yaml.safe_load((GPU_DIR.parent / "networks" / "ib-ndr.yaml").read_text())
    p = tmp_path / "both.yaml"
    p.write_text(yaml.safe_dump(net | {"gb_per_s": 400}))
    with pytest.raises(SpecError, match="gbit_per_s") as info:
        catalog.load_network(str(p))
    assert str(p) in str(info.value)
    p.write_text(yaml.safe_dump({k: v for k, v in net.items() if k != "gbit_per_s"}))
    with pytest.raises(SpecError, match="give exactly one"):
        catalog.load_network(str(p))
