"""Clusters: two torchrun "nodes" on this machine (c10d rendezvous on 127.0.0.1, gloo) for
`verify comm`, `scaling` and `accept` started with --nnodes; the same commands under the user's own
multi-node torchrun and under Slurm's srun variables; rank 0 reports."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from trainledger.verify.multinode import first_host, slurm_env  # noqa: E402

TINY = ["--model", "tiny-llama-debug", "--seq-len", "32", "--gpus", "2", "--device", "cpu"]


def _env(**extra: str) -> dict[str, str]:
    src = os.path.join(os.path.dirname(__file__), "..", "..", "src")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.path.abspath(src), **extra}
    env.pop("RANK", None), env.pop("WORLD_SIZE", None), env.pop("MASTER_ADDR", None)
    return env


def _both(cmds: list[list[str]], envs: list[dict[str, str]], timeout: float = 400) -> list[subprocess.CompletedProcess]:
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e)
             for c, e in zip(cmds, envs)]
    out = []
    for p in procs:
        so, se = p.communicate(timeout=timeout)
        out.append(subprocess.CompletedProcess(p.args, p.returncode, so, se))
    return out


def _port() -> int:
    return random.randint(30000, 45000)


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "trainledger", *args]


def _reporter(res: list[subprocess.CompletedProcess]) -> dict:
    """Exactly one node prints the JSON result; the other says node 0 reports."""
    outs = [r for r in res if r.stdout.strip()]
    assert len(outs) == 1, [(r.returncode, r.stderr[-500:]) for r in res]
    others = [r for r in res if not r.stdout.strip()]
    assert all(r.returncode == 0 for r in others), [r.stderr[-800:] for r in others]
    return json.loads(outs[0].stdout)


def test_first_host_and_slurm_variables():
    assert first_host("gpu[003-005,007],cpu1") == "gpu003"
    assert first_host("node7") == "node7"
    env = slurm_env({"SLURM_PROCID": "9", "SLURM_STEP_NUM_TASKS": "16", "SLURM_LOCALID": "1",
                     "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_TASKS_PER_NODE": "8(x2)",
                     "SLURM_STEP_NODELIST": "dgx[01-02]", "SLURM_JOB_ID": "4242", "SLURM_NODEID": "1"})
    assert env == {"RANK": "9", "WORLD_SIZE": "16", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "8", "GROUP_RANK": "1",
                   "MASTER_ADDR": "dgx01", "MASTER_PORT": str(29500 + 242)}
    assert slurm_env({"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1", "SLURM_LOCALID": "0",
                      "SLURM_JOB_NODELIST": "a"}) is None  # one task: nothing distributed
    # the batch script itself (SLURM_NTASKS of the allocation, but no srun step): one process
    assert slurm_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "16", "SLURM_LOCALID": "0",
                      "SLURM_JOB_NODELIST": "dgx[01-02]"}) is None


@pytest.mark.slow
def test_two_node_launch_comm():
    ep = f"127.0.0.1:{_port()}"
    cmd = _cli("verify", "comm", "--device", "cpu", "--nproc", "1", "--nnodes", "2", "--rdzv-endpoint", ep,
               "--max-size", "64KiB", "--json", "--no-ledger")
    d = _reporter(_both([cmd, cmd], [_env(), _env()]))
    assert d["world_size"] == 2 and all(c["status"] == "ok" for c in d["checks"].values())


@pytest.mark.slow
def test_two_node_launch_scaling():
    ep = f"127.0.0.1:{_port()}"
    cmd = _cli("verify", "scaling", *TINY, "--nproc", "1", "--nnodes", "2", "--rdzv-endpoint", ep, "--steps", "2",
               "--json", "--no-ledger")
    d = _reporter(_both([cmd, cmd], [_env(), _env()]))
    assert [r["world_size"] for r in d["runs"]] == [1, 2]
    assert sum(d["runs"][1]["ranks_per_host"].values()) == 2 and d["runs"][1]["backend"] == "gloo"


@pytest.mark.slow
def test_two_node_launch_accept(tmp_path):
    ep = f"127.0.0.1:{_port()}"
    cmd = _cli("verify", "accept", *TINY, "--nproc", "1", "--nnodes", "2", "--rdzv-endpoint", ep,
               "--workdir", str(tmp_path / "shared"), "--json", "--no-ledger")
    d = _reporter(_both([cmd, cmd], [_env(), _env()]))
    assert d["ok"], [i for i in d["items"] if i["status"] != "pass"]
    assert {i["item"]: i["status"] for i in d["items"]}["restore in a fresh process"] == "pass"


@pytest.mark.slow
def test_scaling_under_the_users_two_node_torchrun():
    """No nested launches: rank 0 times the plan alone, then both ranks train together."""
    ep = f"127.0.0.1:{_port()}"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", ep, "--rdzv-id", "t", "-m", "trainledger", "verify",
           "scaling", *TINY, "--steps", "2", "--json", "--no-ledger"]
    res = _both([cmd, cmd], [_env(), _env()])
    outs = [r.stdout for r in res if r.stdout.strip()]
    assert len(outs) == 1, [r.stderr[-800:] for r in res]
    d = json.loads(outs[0])
    assert [r["world_size"] for r in d["runs"]] == [1, 2]


@pytest.mark.slow
def test_comm_under_srun_variables():
    port = str(_port())
    cmd = _cli("verify", "comm", "--device", "cpu", "--max-size", "64KiB", "--json", "--no-ledger")
    envs = [_env(SLURM_PROCID=str(i), SLURM_NTASKS="2", SLURM_STEP_NUM_TASKS="2", SLURM_LOCALID=str(i),
                 SLURM_STEP_NUM_NODES="1", SLURM_STEP_NODELIST="localhost", SLURM_JOB_ID="77", MASTER_PORT=port)
            for i in (0, 1)]
    d = _reporter(_both([cmd, cmd], envs))
    assert d["world_size"] == 2


@pytest.mark.slow
def test_probe_under_a_two_node_torchrun_reports_every_node():
    ep = f"127.0.0.1:{_port()}"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", ep, "--rdzv-id", "p", "-m", "trainledger", "verify",
           "probe", "--json", "--no-ledger"]
    res = _both([cmd, cmd], [_env(), _env()], timeout=200)
    outs = [r.stdout for r in res if r.stdout.strip()]
    assert len(outs) == 1, [r.stderr[-800:] for r in res]
    d = json.loads(outs[0])
    assert len(d["nodes"]) == 2 and {n["rank"] for n in d["nodes"]} == {0, 1}
