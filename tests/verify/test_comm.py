"""verify comm: nccl-tests bandwidth definitions, 2 gloo ranks under torchrun, faults."""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner

from trainledger.cli import main
from trainledger.errors import VerifyError
from trainledger.units import GIB, KIB, MIB
from trainledger.verify import comm as C

torch = pytest.importorskip("torch")


def test_bus_factors_from_nccl_tests():
    # nccl-tests doc/PERFORMANCE.md: allreduce 2(n-1)/n; allgather, reducescatter, alltoall (n-1)/n
    assert C.bus_factor("all_reduce", 8) == pytest.approx(1.75)
    assert C.bus_factor("all_gather", 8) == pytest.approx(0.875)
    assert C.bus_factor("reduce_scatter", 4) == pytest.approx(0.75)
    assert C.bus_factor("all_to_all", 2) == pytest.approx(0.5)
    assert C.bus_factor("all_reduce", 1) == 0.0
    with pytest.raises(ValueError):
        C.bus_factor("broadcast_tree", 2)


def test_algbw_busbw_by_hand():
    # 1 GB all_reduce in 10 ms on 8 ranks: algbw 100 GB/s, busbw 175 GB/s
    assert C.algbw(1e9, 0.01) == pytest.approx(1e11)
    assert C.busbw("all_reduce", 1e9, 0.01, 8) == pytest.approx(1.75e11)


def test_sizes_and_alignment():
    s = C.sweep_sizes(1 * MIB)
    assert s[0] == KIB and s[-1] == MIB and len(s) == 11
    assert all(b == 2 * a for a, b in zip(s, s[1:]))
    assert C.sweep_sizes(3 * KIB) == [KIB, 2 * KIB, 3 * KIB]
    with pytest.raises(VerifyError, match="below the smallest"):
        C.sweep_sizes(512)
    assert C.aligned_size(1000, 3) == 996 and C.aligned_size(5, 4) == 16
    assert C.iterations_for(1 * GIB) == 3 and C.iterations_for(1 * KIB) == 50


def test_peaks_efficiency_and_verdict():
    sweep = [{"op": "all_reduce", "size_bytes": s, "time_s": t, "algbw_bytes_per_s": s / t,
              "busbw_bytes_per_s": s / t * 1.75} for s, t in ((1e6, 1e-4), (1e8, 1e-3), (1e9, 2e-2))]
    r = C.finish({"world_size": 8, "sweep": sweep, "checks": {"all_reduce": {"status": "ok"}}},
                 {"name": "nvlink4", "what": "x", "bytes_per_s": 450e9})
    assert r["peak"]["all_reduce"]["size_bytes"] == 1e8
    assert r["efficiency"]["all_reduce"] == pytest.approx(175e9 / 450e9)
    # judged against the expected busbw of NVLink 4 (80% of 450 GB/s): 175 GB/s is 49% of it
    assert r["bandwidth"]["judged"] and r["bandwidth"]["fraction_of_expected"] == pytest.approx(175 / 360)
    assert r["correct"] is True and r["ok"] is False
    fast = [dict(x, busbw_bytes_per_s=x["busbw_bytes_per_s"] * 2) for x in sweep]
    r = C.finish({"world_size": 8, "sweep": fast, "checks": {"all_reduce": {"status": "ok"}}, "backend": "nccl",
                  "device": "cuda"}, {"name": "nvlink4", "what": "x", "bytes_per_s": 450e9})
    assert r["ok"] is True and r["bandwidth"]["ok"] is True
    bad = C.finish({"world_size": 2, "sweep": [], "checks": {"all_gather": {"status": "wrong"}}}, None)
    assert bad["ok"] is False and "efficiency" not in bad
    skip = C.finish({"world_size": 2, "sweep": [], "checks": {"reduce_scatter": {"status": "unsupported by backend"}}}, None)
    assert skip["ok"] is True
    one = C.finish({"world_size": 1, "sweep": [{"op": "copy", "size_bytes": 1e9, "time_s": 0.001,
                                                "algbw_bytes_per_s": 1e12, "busbw_bytes_per_s": 1e12}],
                    "checks": {}}, {"name": "h200", "what": "HBM", "bytes_per_s": 4.8e12})
    assert one["efficiency"]["copy"] == pytest.approx(2e12 / 4.8e12)  # read + write traffic


def test_gloo_on_cpu_bandwidth_is_not_judged():
    """issue 18: PASS 'at 0.008% of NVLink' on CPU; gloo's bandwidth says nothing about a GPU link."""
    sweep = [{"op": "all_reduce", "size_bytes": 1e6, "time_s": 1e-2, "algbw_bytes_per_s": 1e8,
              "busbw_bytes_per_s": 1e8}]
    r = C.finish({"world_size": 2, "backend": "gloo", "device": "cpu", "sweep": sweep,
                  "checks": {"all_reduce": {"status": "ok"}}}, {"name": "nvlink4", "what": "NVLink", "bytes_per_s": 450e9})
    assert r["ok"] is True and r["bandwidth"]["judged"] is False and not r.get("efficiency")
    text = C.render(r)
    assert "% of NVLink" not in text and "not judged on CPU/gloo" in text
    assert text.splitlines()[-1] == "verdict: PASS (collectives correct; bandwidth not judged)"


def test_reference_link_from_catalog():
    ref = C.reference_link("cuda", 8, "nvlink4", None)
    assert ref["bytes_per_s"] == pytest.approx(450e9)
    hbm = C.reference_link("cuda", 1, None, "h100-sxm")
    assert "HBM" in hbm["what"]
    assert C.reference_link("cpu", 2, None, None) is None


@pytest.fixture(scope="module")
def single_rank_group():
    import torch.distributed as dist

    from trainledger.verify.launch import free_port

    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_check_reports_unsupported_and_wrong(single_rank_group, monkeypatch):
    from trainledger.verify import comm_worker as W

    dev = torch.device("cpu")
    assert W.check("all_gather", 1, 0, dev)["status"] == "ok"

    def unsupported(op, out, inp, n):
        raise RuntimeError("ProcessGroupGloo does not support reduce_scatter")

    monkeypatch.setattr(W, "_native", unsupported)
    r = W.check("reduce_scatter", 1, 0, dev)
    assert r["status"] == "unsupported by backend" and "emulated result correct" in r["detail"]

    monkeypatch.setattr(W, "_native", lambda op, out, inp, n: out.fill_(-1.0))
    r = W.check("all_gather", 1, 0, dev)
    assert r["status"] == "wrong" and "max abs error" in r["detail"]


def test_two_gloo_ranks_cli(tmp_path):
    r = CliRunner().invoke(main, ["verify", "comm", "--nproc", "2", "--device", "cpu", "--max-size", "16KiB",
                                  "--json", "--ledger", str(tmp_path / "l.db"), "--timeout", "120"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output[r.output.index("{"):])
    assert d["world_size"] == 2 and d["backend"] == "gloo" and d["ok"] is True
    assert {op: c["status"] for op, c in d["checks"].items()} == {op: "ok" for op in C.OPS}
    sizes = sorted({row["size_bytes"] for row in d["sweep"]})
    assert sizes == [1024, 2048, 4096, 8192, 16384]
    for row in d["sweep"]:
        factor = 1.0 if row["op"] == "all_reduce" else 0.5  # 2(n-1)/n and (n-1)/n at n = 2
        assert row["busbw_bytes_per_s"] == pytest.approx(row["algbw_bytes_per_s"] * factor)
        assert row["algbw_bytes_per_s"] == pytest.approx(row["size_bytes"] / row["time_s"])


def test_single_rank_measures_copy():
    d = C.finish(C.run_comm(1, "cpu", 64 * KIB, timeout_s=120), None)
    assert d["world_size"] == 1 and {r["op"] for r in d["sweep"]} == {"copy"}
    assert d["peak"]["copy"]["busbw_bytes_per_s"] > 0


@pytest.mark.slow
def test_killed_rank_fails_fast():
    t0 = time.monotonic()
    with pytest.raises(VerifyError) as e:
        C.run_comm(2, "cpu", 64 * KIB, timeout_s=120, env={"TRAINLEDGER_FAULT": "kill:1:sweep"})
    assert time.monotonic() - t0 < 60
    assert "rank 1" in str(e.value) and "sweep" in str(e.value)


@pytest.mark.slow
def test_hung_rank_hits_the_collective_timeout():
    t0 = time.monotonic()
    with pytest.raises(VerifyError) as e:
        C.run_comm(2, "cpu", 16 * KIB, timeout_s=120, collective_timeout_s=5,
                   env={"TRAINLEDGER_FAULT": "hang:1:check all_gather"})
    assert time.monotonic() - t0 < 90
    assert "rank 1 stopped during 'check all_gather'" in str(e.value)


def test_launch_deadline_kills_the_group():
    from trainledger.verify.launch import run_bounded

    t0 = time.monotonic()
    rc, timed_out, _tail, _ = run_bounded(["sh", "-c", "sleep 30 & sleep 30; wait"], timeout_s=1)
    assert timed_out and time.monotonic() - t0 < 15


def test_cuda_without_a_gpu_is_one_clear_line():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    r = CliRunner().invoke(main, ["verify", "comm", "--device", "cuda", "--no-ledger"])
    assert r.exit_code == 1 and "torch sees no CUDA GPU" in r.output


@pytest.mark.gpu
def test_cuda_copy_and_collectives():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    n = min(2, torch.cuda.device_count())
    d = C.finish(C.run_comm(n, "cuda", 64 * MIB, timeout_s=300), C.reference_link("cuda", n, None, "h100-sxm"))
    assert d["ok"] and d["backend"] == "nccl"
    op = "copy" if n == 1 else "all_reduce"
    assert d["peak"][op]["busbw_bytes_per_s"] > 1e9


@pytest.mark.slow
def test_cli_inside_users_torchrun_acts_as_one_rank():
    """Multi-node style: the user starts torchrun; the command sees it and runs as a rank."""
    import sys

    from trainledger.verify.launch import free_port, run_bounded

    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", "trainledger",
           "verify", "comm", "--max-size", "2KiB", "--json", "--no-ledger"]
    rc, timed_out, out, _ = run_bounded(cmd, timeout_s=120)
    assert rc == 0 and not timed_out, out
    assert out.count('"world_size": 2') == 1  # rank 0 prints, rank 1 stays quiet
