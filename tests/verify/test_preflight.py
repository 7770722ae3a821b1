"""verify memory --device cpu checks the predicted host RAM first (issue 18: killed with no message)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from trainledger.cli import main


def test_cpu_measurement_larger_than_host_ram_is_refused_before_it_starts(monkeypatch, tmp_path):
    pytest.importorskip("torch")
    from trainledger.verify import preflight

    monkeypatch.setattr(preflight, "available_host_bytes", lambda: 8 * 2**30)  # an 8 GiB machine
    r = CliRunner().invoke(main, ["verify", "memory", "--device", "cpu", "-m", "llama-3.1-8b", "--seq-len", "512",
                                  "--ledger", str(tmp_path / "l.db")])
    assert r.exit_code != 0
    err = r.output.strip().splitlines()[-1]
    assert err.startswith("error: measuring llama-3.1-8b on the CPU needs about")
    assert "8.00 GiB available" in err and "--device fake" in err


def test_small_plan_passes_the_check():
    from trainledger.verify.preflight import available_host_bytes, check_host_ram

    check_host_ram("tiny", 1e6, available_host_bytes())
    check_host_ram("tiny", 1e30, None)  # unknown RAM: no refusal
    assert (available_host_bytes() or 1) > 0
