"""Step time, throughput, MFU/HFU and time-to-train of a Plan (issue 4).

The package's public face. The model itself lives in its modules:

* ``step``     — one optimizer step: compute, exposed communication, bubble, optimizer, host
                 (``estimate_compute``, ``estimate_time``, ``ComputeEstimate``, ``TimeEstimate``)
* ``work``     — compute seconds of one micro-batch (GEMMs, attention, streaming kernels)
* ``compute``  — FLOP counts; ``comm`` — collectives; ``efficiency``/``stack`` — achievable rates
* ``scaling``  — strong-scaling curves over GPU counts (calls ``step.point_figures``)
* ``calibration``, ``intervals`` — measured-run factors and residual intervals

Dependencies run one way (scaling -> step -> work/comm/compute/stack/efficiency); this module
only re-exports.
"""

from trainledger.estimate.time.step import (ComputeEstimate, TimeEstimate, estimate_compute,
                                            estimate_time, matmul_dtype)
from trainledger.estimate.time.scaling import scaling_curve

__all__ = ["ComputeEstimate", "TimeEstimate", "estimate_compute", "estimate_time", "matmul_dtype",
           "scaling_curve"]
