"""Bounded loopback load test of the web API's estimate and plan endpoints (issue 9).

    python bench/web_load.py                       # 8 clients, 200 estimate + 40 plan requests
    python bench/web_load.py --clients 16 --estimate 400 --plan 80 --max-seconds 120

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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--estimate", type=int, default=200, help="estimate requests in all")
    ap.add_argument("--plan", type=int, default=40, help="plan requests in all")
    ap.add_argument("--max-seconds", type=float, default=90.0, help="per endpoint")
    ap.add_argument("--timeout", type=float, default=60.0, help="per request")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
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
