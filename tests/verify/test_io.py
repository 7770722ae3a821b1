"""verify io: fio parsing, the built-in reader on a temp folder, the plan's loading need."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from trainledger.cli import main
from trainledger.errors import VerifyError
from trainledger.load.plan import build_plan, parse_inputs
from trainledger.units import MIB
from trainledger.verify import io as vio

# The shape of `fio --output-format=json` (fio HOWTO, "JSON output"): jobs[].read.{iops,bw_bytes}
FIO_SAMPLE = {"fio version": "fio-3.36", "jobs": [{"jobname": "trainledger", "error": 0,
              "read": {"io_bytes": 4294967296, "bw_bytes": 858993459, "bw": 838860, "iops": 209715.2,
                       "runtime": 5000}, "write": {"iops": 0.0, "bw_bytes": 0}}]}


def test_parse_fio():
    assert vio.parse_fio(FIO_SAMPLE) == {"iops": 209715.2, "bytes_per_s": 858993459.0}
    with pytest.raises(VerifyError, match="unexpected fio JSON"):
        vio.parse_fio({"jobs": []})


@pytest.mark.parametrize("vocab,bpt", [(256, 2), (65536, 2), (65537, 4), (128256, 4)])
def test_bytes_per_token(vocab, bpt):
    assert vio.bytes_per_token(vocab) == bpt


def test_need_by_hand():
    # 1e6 tokens/s over 2 nodes, s = 4096, V = 128256 (uint32 ids): 5e5 tokens/s/node = 2e6 B/s;
    # samples/s = 5e5/4096 = 122.07; each sample = 16 KiB = 4 reads of 4 KiB -> 488.3 IOPS
    n = vio.need_from_rate(1e6, 4096, 128256, nodes=2)
    assert n["read_bytes_per_s"] == pytest.approx(2e6)
    assert n["random_4k_iops"] == pytest.approx(5e5 / 4096 * 4)


def test_compare_pass_and_fail():
    storage = {"seq_read_bytes_per_s": 1e9, "random_4k_iops": 1000.0}
    out = vio.compare(storage, {"read_bytes_per_s": 5e8, "random_4k_iops": 2000.0})
    assert [(c["check"], c["ok"]) for c in out] == [("sequential read", True), ("random 4 KiB reads", False)]
    assert out[0]["ratio"] == pytest.approx(2.0) and out[1]["ratio"] == pytest.approx(0.5)
    assert vio.compare(storage, None) == []


def test_plan_need_sources():
    plan = build_plan(parse_inputs({"model": "tiny-llama-debug", "seq_len": 128}))
    given = vio.plan_need(plan, None, tokens_per_s=2.56e5)
    assert given["read_bytes_per_s"] == pytest.approx(2.56e5 * 2) and "--tokens-per-s" in given["source"]

    class Est:  # an estimate with an io section
        extra = {"io": {"read_bytes_per_s_per_node": 123.0, "iops_per_node": 4.0}}
        compute = None

    assert vio.plan_need(plan, Est())["read_bytes_per_s"] == 123.0

    class Timed:  # no io section: tokens per step / step time
        extra: dict = {}

        class compute:  # noqa: N801
            step_time_s = 0.5

    need = vio.plan_need(plan, Timed())
    assert need["tokens_per_s_per_node"] == pytest.approx(plan.tokens_per_step / 0.5)
    assert vio.plan_need(plan, None) is None


def test_builtin_reader_is_bounded_and_cleans_up(tmp_path):
    res = vio.measure_storage(tmp_path, size=4 * MIB, budget_s=0.3, threads=4, use_fio=False)
    assert res["tool"] == "builtin" and res["mode"] in ("direct", "buffered")
    assert res["seq_read_bytes_per_s"] > 0 and res["random_4k_iops"] > 0
    assert res["file_bytes"] == 4 * MIB
    assert list(tmp_path.iterdir()) == []  # the test file is gone
    with pytest.raises(VerifyError, match="not a directory"):
        vio.measure_storage(tmp_path / "missing")


def test_memory_bandwidth():
    m = vio.memory_bandwidth(size=8 * MIB, repeats=2)
    assert m["array_bytes"] == 8 * MIB and m["copy_bytes_per_s"] > 1e8 and math.isfinite(m["copy_bytes_per_s"])


def test_cli_io(tmp_path):
    base = ["verify", "io", "--path", str(tmp_path), "--size", "2MiB", "--budget", "0.2", "--no-fio", "--no-ledger"]
    r = CliRunner().invoke(main, base + ["--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output[r.output.index("{"):])
    assert d["need"] is None and d["checks"] == [] and d["ok"] is True
    r = CliRunner().invoke(main, base + ["--model", "tiny-llama-debug", "--tokens-per-s", "1e15"])
    assert r.exit_code == 1 and "FAIL  sequential read" in r.output
