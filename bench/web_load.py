"""Bounded loopback load test of the web API's estimate and plan endpoints (issue 9), and three
attack shapes against a real server (issue 20).

    python bench/web_load.py                       # 8 clients, 200 estimate + 40 plan requests
    python bench/web_load.py --clients 16 --estimate 400 --plan 80 --max-seconds 120
    python bench/web_load.py --attacks             # slow configs, idle connections, planner flood
    python bench/web_load.py --attacks --src /tmp/old/src   # the same against another source tree

Attack mode starts ``trainledger.web.serve`` (the server exactly as ``trainledger serve`` runs it)
in a subprocess on 127.0.0.1 and, per attack, probes a cheap ``GET /api/gpus`` every 50 ms while
the attack runs for ``--attack-seconds``. Printed per attack: cheap-request p50/p99/max latency
and failures, the attack's requests by answer status (refused ones: 503 busy / 413 / 400 ...),
and the CPU-seconds the server (its process tree) burned in ``--quiet-seconds`` after the attack's
clients stopped or gave up — work that should have stopped with the requests. Attacks:
``baseline``: no attack (the machine's own probe latency); ``slow-config``: 3 clients paste a 10,000-layer config.json (each gives up after 5 s);
``idle-connections``: 300 connections that send half a request and wait;
``planner``: 4 clients post the most expensive planner request (all GPUs, 4096 GPUs), giving up
after 3 s, beside the cheap probe.

Starts the real app under uvicorn on 127.0.0.1 (a free port; loopback only, never another
interface), then runs a fixed number of requests from a fixed number of concurrent clients
(asyncio + httpx), stopping early at ``--max-seconds``. Prints, per endpoint: requests, requests/s,
p50/p99/max latency and the error count (any non-2xx answer or transport error is an error). Exit
status 1 when any request failed. The app runs at most ``trainledger.web.app.WORKERS`` library
calls at once, so latency under load includes queueing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

HOST = "127.0.0.1"

#: a realistic mix: presets of different sizes, single- and multi-GPU layouts
ESTIMATE_BODIES = [
    {"inputs": {"model": "llama-3.1-8b", "gpu": "h100-sxm", "gpus": 8, "zero": 3, "tokens": 2e10}},
    {"inputs": {"model": "qwen2.5-7b", "gpu": "a100-sxm-80gb", "gpus": 1, "method": "lora"}},
    {"inputs": {"model": "llama-3.1-70b", "gpu": "h100-sxm", "gpus": 64, "tp": 8, "zero": 1,
                "tokens": 1e11}},
    {"inputs": {"model": "mixtral-8x7b", "gpu": "h200", "gpus": 8, "ep": 8, "zero": 3}},
]
PLAN_BODIES = [
    {"model": "llama-3.2-1b", "gpus": ["h100-sxm", "a100-sxm-80gb"], "max_gpus": 16, "tokens": 1e10},
    {"model": "qwen2.5-7b", "gpus": ["h100-sxm"], "max_gpus": 64, "tokens": 5e10, "deadline_days": 7},
]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def start_server(port: int):
    import uvicorn

    from trainledger.web.app import create_app

    config = uvicorn.Config(create_app(), host=HOST, port=port, log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if time.monotonic() > deadline:
            raise SystemExit("the server did not start within 60 s")
        time.sleep(0.05)
    return server, thread


async def run_endpoint(base: str, path: str, bodies: list[dict], total: int, clients: int,
                       max_seconds: float, timeout_s: float) -> dict:
    import httpx

    lat: list[float] = []
    errors: list[str] = []
    counter = iter(range(total))
    stop = time.monotonic() + max_seconds

    async def client(cid: int) -> None:
        async with httpx.AsyncClient(base_url=base, timeout=timeout_s) as c:
            for i in counter:
                if time.monotonic() > stop:
                    return
                body = bodies[(i + cid) % len(bodies)]
                t0 = time.perf_counter()
                try:
                    r = await c.post(path, json=body)
                    ok = 200 <= r.status_code < 300
                    if not ok:
                        errors.append(f"{r.status_code}: {r.text[:120]}")
                except httpx.HTTPError as exc:
                    errors.append(f"{type(exc).__name__}: {exc}")
                    ok = False
                lat.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(clients)))
    wall = time.perf_counter() - t0
    qs = statistics.quantiles(lat, n=100, method="inclusive") if len(lat) >= 2 else lat * 99
    return {"path": path, "requests": len(lat), "clients": clients, "seconds": wall,
            "requests_per_s": len(lat) / wall if wall else 0.0,
            "p50_ms": 1000 * qs[49], "p99_ms": 1000 * qs[98], "max_ms": 1000 * max(lat, default=0.0),
            "errors": len(errors), "first_errors": errors[:3]}


# ------------------------------------------------------------------------------------ attacks (issue 20)
def _tree_cpu_s(pid: int) -> float:
    """CPU seconds of ``pid``, its reaped children and its live descendants (Linux /proc)."""
    import os

    tick = os.sysconf("SC_CLK_TCK")

    def stat(p: int) -> list[str] | None:
        try:
            with open(f"/proc/{p}/stat", "rb") as f:
                return f.read().decode().rsplit(")", 1)[1].split()
        except OSError:
            return None

    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (st := stat(int(name))):
            kids.setdefault(int(st[1]), []).append(int(name))
    total, todo, first = 0.0, [pid], True
    while todo:
        p = todo.pop()
        st = stat(p)
        if st:
            total += (int(st[11]) + int(st[12]) + (int(st[13]) + int(st[14]) if first else 0)) / tick
        first = False
        todo += kids.get(p, [])
    return total


def start_server_process(port: int, src: str | None):
    import os
    import subprocess

    env = {**os.environ, "PYTHONPATH": src or str(Path(__file__).resolve().parents[1] / "src"), "HF_HUB_OFFLINE": "1"}
    code = f"from trainledger.web import serve; serve({HOST!r}, {port})"
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    import httpx

    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://{HOST}:{port}/api/gpus", timeout=5).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit("the server exited at start")
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("the server did not start within 90 s")


def _huge_config(layers: int = 10_000) -> str:
    return json.dumps({"model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 128,
                       "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2,
                       "vocab_size": 1000, "num_experts": 4, "num_experts_per_tok": 2,
                       "moe_intermediate_size": 32, "mlp_only_layers": list(range(layers))})


async def _probe(base: str, stop: asyncio.Event, lat: list[float], fails: list[str]) -> None:
    import httpx

    async with httpx.AsyncClient(base_url=base, timeout=10) as c:
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                r = await c.get("/api/gpus")
                if r.status_code != 200:
                    fails.append(str(r.status_code))
            except httpx.HTTPError as exc:
                fails.append(type(exc).__name__)
            lat.append(time.perf_counter() - t0)
            await asyncio.sleep(0.05)


async def _flood(base: str, path: str, body: dict, clients: int, give_up_s: float, stop: asyncio.Event,
                 statuses: Counter) -> None:
    import httpx

    async def one() -> None:
        async with httpx.AsyncClient(base_url=base, timeout=give_up_s) as c:
            while not stop.is_set():
                try:
                    r = await c.post(path, json=body)
                    statuses[str(r.status_code)] += 1
                    if r.status_code == 503:
                        await asyncio.sleep(0.2)
                except httpx.TimeoutException:
                    statuses["gave up"] += 1
                except httpx.HTTPError as exc:
                    statuses[type(exc).__name__] += 1

    await asyncio.gather(*(one() for _ in range(clients)))


async def _idle(port: int, n: int, stop: asyncio.Event, statuses: Counter) -> None:
    """n connections that send half a request, then wait (re-opened when the server drops them)."""
    half = (b"POST /api/estimate HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            b"content-length: 1000\r\n\r\n{\"inputs\": ")

    async def one(i: int) -> None:
        while not stop.is_set():
            try:
                reader, writer = await asyncio.open_connection(HOST, port)
                writer.write(half if i % 2 else half.split(b"content-type")[0])
                await writer.drain()
                statuses["opened"] += 1
                data = await reader.read(100)
                statuses["closed by server " + (data.split(b" ")[1].decode() if data.startswith(b"HTTP") else "")] += 1
                writer.close()
            except OSError as exc:
                statuses[type(exc).__name__] += 1
                await asyncio.sleep(0.5)

    tasks = [asyncio.create_task(one(i)) for i in range(n)]
    await stop.wait()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _attack(kind: str, base: str, port: int, seconds: float) -> dict:
    stop = asyncio.Event()
    lat: list[float] = []
    fails: list[str] = []
    statuses: Counter = Counter()
    if kind == "slow-config":
        attack = _flood(base, "/api/estimate", {"config_json": _huge_config()}, 3, 5.0, stop, statuses)
    elif kind == "planner":
        from trainledger.load.catalog import names

        body = {"model": "llama-3.1-70b", "gpus": names("gpus")[:40], "max_gpus": 4096}
        attack = _flood(base, "/api/plan", body, 4, 3.0, stop, statuses)
    elif kind == "idle-connections":
        attack = _idle(port, 300, stop, statuses)
    else:  # "baseline": the probe alone, for the machine's own latency
        attack = stop.wait()
    task = asyncio.create_task(attack)
    await asyncio.sleep(1.0)  # let the attack build up before probing
    probe = asyncio.create_task(_probe(base, stop, lat, fails))
    await asyncio.sleep(seconds)
    stop.set()
    await asyncio.gather(task, probe, return_exceptions=True)
    qs = statistics.quantiles(lat, n=100, method="inclusive") if len(lat) >= 2 else lat * 99
    return {"attack": kind, "probes": len(lat), "p50_ms": 1000 * qs[49], "p99_ms": 1000 * qs[98],
            "max_ms": 1000 * max(lat, default=0.0), "probe_failures": len(fails),
            "attack_answers": dict(statuses)}


def attacks_main(a: argparse.Namespace) -> int:
    port = free_port()
    proc = start_server_process(port, a.src)
    base = f"http://{HOST}:{port}"
    rows = []
    try:
        for kind in a.attack_kinds.split(","):
            row = asyncio.run(_attack(kind, base, port, a.attack_seconds))
            cpu0 = _tree_cpu_s(proc.pid)
            time.sleep(a.quiet_seconds)
            row["cpu_s_after"] = _tree_cpu_s(proc.pid) - cpu0
            rows.append(row)
            if a.verbose:
                print(json.dumps(row), flush=True)
            time.sleep(1.0)
    finally:
        import os
        import signal

        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    if a.json:
        print(json.dumps(rows, indent=1))
    else:
        print(f"attacks on {base} (loopback), server from {a.src or 'this checkout'}; {a.attack_seconds:g} s "
              f"each, CPU measured {a.quiet_seconds:g} s after the attack stopped")
        print(f"{'attack':<17} {'probes':>6} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} {'fails':>5} "
              f"{'CPU-s after':>11}  attack requests by answer")
        for r in rows:
            answers = ", ".join(f"{k}: {v}" for k, v in sorted(r["attack_answers"].items()))
            print(f"{r['attack']:<17} {r['probes']:>6} {r['p50_ms']:>7.0f} {r['p99_ms']:>7.0f} {r['max_ms']:>7.0f} "
                  f"{r['probe_failures']:>5} {r['cpu_s_after']:>11.1f}  {answers}")
    ok = all(r["p99_ms"] < 100 and not r["probe_failures"] and r["cpu_s_after"] < 1.0
             for r in rows if r["attack"] != "baseline")
    return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--attacks", action="store_true", help="run the issue-20 attack shapes instead")
    ap.add_argument("--attack-kinds", default="baseline,slow-config,idle-connections,planner")
    ap.add_argument("--attack-seconds", type=float, default=12.0)
    ap.add_argument("--quiet-seconds", type=float, default=5.0)
    ap.add_argument("--src", help="source tree of the server (attack mode; default: this checkout)")
    ap.add_argument("--verbose", "-v", action="store_true")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--estimate", type=int, default=200, help="estimate requests in all")
    ap.add_argument("--plan", type=int, default=40, help="plan requests in all")
    ap.add_argument("--max-seconds", type=float, default=90.0, help="per endpoint")
    ap.add_argument("--timeout", type=float, default=60.0, help="per request")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.attacks:
        return attacks_main(a)
    port = free_port()
    server, thread = start_server(port)
    base = f"http://{HOST}:{port}"
    try:
        import httpx

        warm = httpx.post(base + "/api/estimate", json=ESTIMATE_BODIES[0], timeout=60)  # caches
        if warm.status_code != 200:
            raise SystemExit(f"warm-up request failed: {warm.status_code} {warm.text[:200]}")
        rows = [asyncio.run(run_endpoint(base, "/api/estimate", ESTIMATE_BODIES, a.estimate, a.clients,
                                         a.max_seconds, a.timeout)),
                asyncio.run(run_endpoint(base, "/api/plan", PLAN_BODIES, a.plan, a.clients,
                                         a.max_seconds, a.timeout))]
    finally:
        server.should_exit = True
        thread.join(timeout=30)
    if a.json:
        print(json.dumps(rows, indent=1))
    else:
        from trainledger.web.app import WORKERS

        print(f"web load on {base} (loopback), {a.clients} concurrent clients, server runs "
              f"{WORKERS} library calls at once")
        print(f"{'endpoint':<14} {'requests':>8} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'errors':>6}")
        for r in rows:
            print(f"{r['path']:<14} {r['requests']:>8} {r['requests_per_s']:>8.1f} {r['p50_ms']:>8.0f} "
                  f"{r['p99_ms']:>8.0f} {r['max_ms']:>8.0f} {r['errors']:>6}")
            for e in r["first_errors"]:
                print(f"    error: {e}")
    return 1 if any(r["errors"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
