"""Issue 20, web: bounded work per request, killable cancelled work, cheap GETs beside expensive
ones, and connection limits that half-sent requests cannot exhaust. A real uvicorn server on
127.0.0.1 runs with the same configuration as ``trainledger serve`` (``web.conn.uvicorn_config``)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from trainledger.web import service  # noqa: E402
from trainledger.web.app import create_app  # noqa: E402

TIMEOUT_S = 1.5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def base():
    from trainledger.web.conn import uvicorn_config

    port = _free_port()
    app = create_app(timeout_s=TIMEOUT_S, workers=1, queue=1)
    server = uvicorn.Server(uvicorn_config(app, "127.0.0.1", port, lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def _huge_config(layers: int) -> str:
    return json.dumps({"model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 128,
                       "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2,
                       "vocab_size": 1000, "num_experts": 4, "num_experts_per_tok": 2,
                       "moe_intermediate_size": 32, "mlp_only_layers": list(range(0, layers, 2))})


def test_huge_layer_counts_are_refused_and_large_ones_are_linear(base):
    t0 = time.perf_counter()
    r = httpx.post(base + "/api/estimate", json={"config_json": _huge_config(10_000)}, timeout=60)
    assert r.status_code == 400 and r.json()["field"] == "config_json", r.text
    assert "num_hidden_layers" in r.json()["error"]
    assert time.perf_counter() - t0 < 2.0
    # the largest accepted depth, half its layers dense via mlp_only_layers: answered well in time
    r = httpx.post(base + "/api/estimate", json={"config_json": _huge_config(1024)}, timeout=60)
    assert r.status_code == 200, r.text[:300]


@pytest.mark.parametrize("entries, message", [(list(range(5000)), "at most 8"), ([0, 0], "distinct"),
                                              ([99], "distinct layer indices in [0, 8)")])
def test_layer_lists_longer_than_the_model_are_refused(base, entries, message):
    cfg = json.loads(_huge_config(8))
    cfg["mlp_only_layers"] = entries
    r = httpx.post(base + "/api/estimate", json={"config_json": json.dumps(cfg)}, timeout=30)
    assert r.status_code == 400 and message in r.json()["error"], r.text


def _burn(path: str):
    def burn(*_a):  # CPU-bound work that says it is still alive
        while True:
            with open(path, "a") as f:
                f.write(".")
            t = time.perf_counter()
            while time.perf_counter() - t < 0.01:
                pass
    return burn


def test_work_past_the_deadline_is_killed_not_abandoned(base, monkeypatch, tmp_path):
    beat = tmp_path / "beat"
    monkeypatch.setattr(service, "estimate_view", _burn(str(beat)))
    t0 = time.perf_counter()
    r = httpx.post(base + "/api/estimate", json={}, timeout=30)
    assert r.status_code == 503 and "longer than" in r.json()["error"]
    assert r.headers.get("retry-after")
    assert time.perf_counter() - t0 < TIMEOUT_S + 1.5
    size = beat.stat().st_size
    assert size > 0
    time.sleep(0.6)
    assert beat.stat().st_size == size, "the cancelled request kept computing"


def test_client_leaving_stops_the_work(monkeypatch, tmp_path):
    """A client that gives up takes its work with it, long before the request's deadline."""
    from trainledger.web.conn import uvicorn_config

    beat = tmp_path / "beat"
    monkeypatch.setattr(service, "plan_view", _burn(str(beat)))
    port = _free_port()
    server = uvicorn.Server(uvicorn_config(create_app(timeout_s=30.0), "127.0.0.1", port, lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    try:
        t0 = time.monotonic()
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"http://127.0.0.1:{port}/api/plan", json={"model": "llama-3.2-1b", "gpus": ["h100-sxm"]},
                       timeout=0.5)
        time.sleep(0.6)  # a few disconnect polls
        size = beat.stat().st_size
        time.sleep(0.5)
        assert beat.stat().st_size == size, "the work went on after its client left"
        assert time.monotonic() - t0 < 5
    finally:
        server.should_exit = True
        thread.join(10)


def test_cheap_gets_never_wait_behind_expensive_requests(monkeypatch):
    """While every compute slot is busy for 6 s, catalog GETs are answered at once (2 slots on
    old main made them wait the full 6 s), and requests past the waiting line get 503 "busy"."""
    from trainledger.web.conn import uvicorn_config

    busy_s = 6.0
    monkeypatch.setattr(service, "plan_view", lambda req: time.sleep(busy_s) or {})
    port = _free_port()
    app = create_app(timeout_s=30.0, workers=1, queue=1)
    server = uvicorn.Server(uvicorn_config(app, "127.0.0.1", port, lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    base = f"http://127.0.0.1:{port}"
    try:
        httpx.get(base + "/api/gpus", timeout=10)  # cached
        results: list[int] = []

        def slow():
            results.append(httpx.post(base + "/api/plan", json={"model": "llama-3.2-1b", "gpus": ["h100-sxm"]},
                                      timeout=60).status_code)

        threads = [threading.Thread(target=slow) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        t0 = time.perf_counter()
        lat = []
        for _ in range(5):
            t1 = time.perf_counter()
            assert httpx.get(base + "/api/gpus", timeout=10).status_code == 200
            lat.append(time.perf_counter() - t1)
        assert time.perf_counter() - t0 < busy_s / 2, lat  # all five while the first slot is still busy
        for t in threads:
            t.join()
        # one computing, one waiting (then computing), two refused at once with a clear "busy"
        assert sorted(results) == [200, 200, 503, 503], results
    finally:
        server.should_exit = True
        thread.join(10)


def _half_open(port: int, payload: bytes) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(payload)
    return s


def test_half_sent_requests_cannot_exhaust_the_server(base):
    port = int(base.rsplit(":", 1)[1])
    held = [_half_open(port, b"POST /api/estimate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le")
            for _ in range(80)]
    held += [_half_open(port, b"POST /api/estimate HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json"
                              b"\r\ncontent-length: 1000\r\n\r\n{\"inputs\": ") for _ in range(20)]
    try:
        for _ in range(5):
            r = httpx.get(base + "/api/gpus", timeout=5)
            assert r.status_code == 200, r.text
    finally:
        for s in held:
            s.close()


def test_half_sent_headers_and_bodies_time_out(monkeypatch):
    from trainledger.web import conn

    monkeypatch.setattr(conn.GuardedH11Protocol, "read_timeout_s", 0.5)
    port = _free_port()
    server = uvicorn.Server(conn.uvicorn_config(create_app(), "127.0.0.1", port, lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    try:
        heads = _half_open(port, b"GET /api/gpus HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        body = _half_open(port, b"POST /api/estimate HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json"
                                b"\r\ncontent-length: 1000\r\n\r\n{\"inputs\": ")
        silent = socket.create_connection(("127.0.0.1", port), timeout=5)
        t0 = time.perf_counter()
        answers = [s.recv(4096) for s in (heads, body, silent)]
        assert time.perf_counter() - t0 < 3.0
        assert answers[0].startswith(b"HTTP/1.1 408") and answers[2].startswith(b"HTTP/1.1 408")
        assert b"200 OK" not in answers[1]
        assert heads.recv(10) == b"" and silent.recv(10) == b""  # closed
        # a prompt client is unaffected
        assert httpx.get(f"http://127.0.0.1:{port}/api/gpus", timeout=5).status_code == 200
    finally:
        server.should_exit = True
        thread.join(10)


def test_children_are_reaped():
    if not Path("/proc/self/task").exists():
        pytest.skip("needs /proc")
    me = os.getpid()
    zombies = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parts = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if parts[0] == "Z" and int(parts[1]) == me:
            zombies.append(stat)
    assert not zombies
