"""The energy, cost, io, checkpoint, host and interconnect sections of one plan, built together (issue 5).

``estimate()`` adds them to ``Estimate.extra``; each reads the memory and time results it is
given and states in its notes what it could not compute without them.
"""

from __future__ import annotations

from typing import Any

from trainledger.spec.plan import Plan
from trainledger.estimate.run.common import Section
from trainledger.estimate.run.checkpoint import checkpoint_section
from trainledger.estimate.run.cost import cost_section
from trainledger.estimate.run.energy import energy_section
from trainledger.estimate.run.fabric import interconnect_section
from trainledger.estimate.run.goodput import goodput_section
from trainledger.estimate.run.host import host_section
from trainledger.estimate.run.io import io_section
from trainledger.estimate.options import CostOptions
from trainledger.estimate.run.prices import load_prices

SECTION_KEYS = ("energy", "cost", "io", "checkpoint", "host", "interconnect", "goodput")


def ledger_sections(plan: Plan, options: CostOptions | None = None, memory: Any = None,
                    compute: Any = None, time: Any = None) -> dict[str, Section]:
    """``{"energy", "cost", "io", "checkpoint", "host", "interconnect", "goodput"}`` sections of ``plan``."""
    options = options or CostOptions()
    prices = load_prices(options.prices_file)
    args = (plan, options, memory, compute, time, prices)
    ck = checkpoint_section(*args)
    cost = cost_section(*args)
    gp = goodput_section(*args, checkpoint=ck, cost=cost)
    cost.values.update(failures_usd=gp.get("added_usd"), cloud_usd_with_failures=gp.get("cloud_usd_with_failures"))
    return {"energy": energy_section(*args), "cost": cost, "io": io_section(*args),
            "checkpoint": ck, "host": host_section(*args, checkpoint=ck),
            "interconnect": interconnect_section(*args), "goodput": gp}
