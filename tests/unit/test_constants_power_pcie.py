"""Power and host-link constants of the time and energy models: physical bounds and the
documented defaults they must agree on."""

from __future__ import annotations

import re

from trainledger.estimate.run import energy
from trainledger.estimate.time.step import HOST_PCIE_BYTES_PER_S
from trainledger.estimate.time import stack
from trainledger.spec.cluster import GpuSpec


def test_offload_copies_stay_below_what_pcie_gen4_x16_can_carry():
    """PCIe Gen4: 16 GT/s per lane, 128b/130b encoding (PCI-SIG PCIe 4.0 base spec), x16: 31.5 GB/s
    per direction. Every 256-byte max payload also carries ~24 bytes of TLP header, sequence
    number, LCRC and framing, so data can move at most 256/280 of that; pinned cudaMemcpy reaches
    ~80% of the raw rate (CUDA samples bandwidthTest on Gen4 x16 hosts: ~24-26 GB/s)."""
    raw = 16e9 * 16 * (128 / 130) / 8
    ceiling = raw * 256 / (256 + 24)
    assert 0.75 * raw <= HOST_PCIE_BYTES_PER_S <= ceiling


def test_idle_power_default_is_the_one_gpuspec_documents():
    """GpuSpec.idle_w documents its default as a share of TDP; the energy model and the DVFS clock
    model must both use that share when a GPU file gives no idle power."""
    doc = GpuSpec.model_fields["idle_w"].description
    share = float(re.search(r"(\d+(?:\.\d+)?)% of TDP", doc).group(1)) / 100
    assert energy.IDLE_FRACTION_OF_TDP == share
    assert stack.IDLE_FRACTION == share
