"""The JSON API with FastAPI's TestClient: answers match the library, errors name the field,
limits and security headers hold, and no endpoint touches a file the client names."""

from __future__ import annotations

import json
import time

import pytest

fastapi = pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from trainledger.estimate import estimate  # noqa: E402
from trainledger.load.hf import load_hf_config, preset_names  # noqa: E402
from trainledger.load.plan import PlanInputs, build_plan  # noqa: E402
from trainledger.web import create_app  # noqa: E402

SECURITY = {"content-security-policy", "x-content-type-options", "referrer-policy", "x-frame-options"}


@pytest.fixture(scope="module")
def client():
    return TestClient(create_app())


def test_catalog_endpoints(client):
    presets = client.get("/api/presets").json()
    assert sorted(p["name"] for p in presets) == sorted(preset_names())
    qwen = client.get("/api/presets", params={"q": "qwen"}).json()
    assert qwen and all("qwen" in p["name"] or "qwen" in (p["source"] or "").lower() for p in qwen)
    gpus = {g["name"]: g for g in client.get("/api/gpus").json()}
    assert {"h100-sxm", "h200", "rtx-4090", "mi300x", "b200"} <= set(gpus)
    opts = client.get("/api/options").json()
    assert "lora" in opts["method"] and opts["defaults"]["gpu"] == "h100-sxm"


def test_estimate_matches_the_library_and_the_verdict_flips(client):
    base = {"model": "llama-3.2-1b", "method": "full", "gpus": 1}
    verdicts = {}
    for gpu in ("h100-sxm", "rtx-4090"):
        body = client.post("/api/estimate", json={"inputs": {**base, "gpu": gpu}}).json()
        est = estimate(build_plan(PlanInputs(**base, gpu=gpu))).to_dict()
        assert body["fits"] == est["memory"]["fits"]
        assert body["estimate"]["memory"]["device_total_bytes"] == est["memory"]["device_total_bytes"]
        summary = dict(body["summary"])
        assert summary["fit verdict"] == ("FITS" if est["memory"]["fits"] else "DOES NOT FIT")
        assert f"{est['memory']['device_total_bytes'] / 2**30:,.2f} GiB" in summary["memory per GPU"]
        assert any(s["id"] == "gpus" for s in body["sections"])
        assert "<svg" in json.dumps(body["sections"])
        verdicts[gpu] = body["fits"]
    assert set(verdicts.values()) == {True, False}  # 80 GB vs 24 GB: the verdict flips


@pytest.mark.parametrize("payload,status,field", [
    ({"inputs": {"gpu": "h100"}}, 400, "gpu"),
    ({"inputs": {"model": "llama-3.1-8b.json"}}, 400, "model"),
    ({"inputs": {"model": "/etc/passwd"}}, 422, "model"),
    ({"inputs": {"model": "../../secrets"}}, 422, "model"),
    ({"inputs": {"gpus": 8, "tp": 3}}, 400, "tp"),
    ({"inputs": {"gpus": 8, "dp": 4}}, 400, "dp"),
    ({"inputs": {"gpus": 8, "vp": 2}}, 400, "vp"),
    ({"inputs": {"gpus": 12}}, 400, "gpus_per_node"),
    ({"inputs": {"seq_len": -1}}, 422, "seq_len"),
    ({"inputs": {"network": "ib-nope", "gpus": 16}}, 400, "network"),
    ({"inputs": {"corpus": "/etc/passwd"}}, 422, "corpus"),
    ({"config_json": "{not json"}, 400, "config_json"),
    ({"config_json": json.dumps({"model_type": "evil", "auto_map": {"AutoModel": "x.Y"}})}, 400, "config_json"),
    ({"config_json": "[" * 50_000}, 400, "config_json"),
    ({"config_json": '{"model_type": "llama", "hidden_size": ' + "9" * 5000 + "}"}, 400, "config_json"),
    ({"inputs": {"tp": True}}, 422, "tp"),  # strict JSON types: a boolean is not a degree
    ({"inputs": {"gpus": "8"}}, 422, "gpus"),
    ({"compare_gpus": ["h100-sxm", "nope"]}, 400, "compare_gpus"),
    ({"prices": {"provider": "acme"}}, 400, "provider"),
])
def test_errors_are_4xx_and_name_the_field(client, payload, status, field):
    r = client.post("/api/estimate", json=payload)
    assert r.status_code == status, r.text
    body = r.json()
    assert body["field"] == field and body["error"]
    assert SECURITY <= set(r.headers)


@pytest.mark.parametrize("price", [5e-324, 1000.0])
def test_extreme_but_valid_prices_are_answered(client, price):
    """Found by schemathesis: a denormal price made chart ticks impossible to round (a 500)."""
    r = client.post("/api/estimate", json={"inputs": {"model": "llama-3.2-1b", "tokens": 1e9},
                                           "prices": {"price_per_gpu_hour": price}})
    assert r.status_code == 200, r.text
    assert r.json()["estimate"]["cost"]["usd_per_gpu_hour"] == price


def test_pasted_config_is_parsed_from_the_body_and_never_opened(monkeypatch):
    import trainledger.load.hf as hf

    client = TestClient(create_app(isolate=False))  # threads: the patched readers are the ones used

    cfg = load_hf_config("qwen2.5-0.5b")

    def no_files(*a, **k):
        raise AssertionError("the web app must not open files named by the client")

    monkeypatch.setattr(hf, "_read_config", no_files)
    monkeypatch.setattr(hf, "_hub_config_path", no_files)
    r = client.post("/api/estimate", json={"config_json": json.dumps(cfg), "inputs": {"gpu": "l40s"}})
    assert r.status_code == 200, r.text
    est = estimate(build_plan(PlanInputs(model="qwen2.5-0.5b", gpu="l40s"))).to_dict()
    assert r.json()["estimate"]["memory"]["device_total_bytes"] == est["memory"]["device_total_bytes"]
    for model in ("Qwen/Qwen2.5-0.5B-nope", "some/hub-id"):  # Hub ids are never resolved by the web app
        assert client.post("/api/estimate", json={"inputs": {"model": model}}).json()["field"] == "model"


def test_body_size_limit(client):
    from trainledger.web.app import MAX_BODY_BYTES

    r = client.post("/api/estimate", content=b" " * (MAX_BODY_BYTES + 1), headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["field"] is None
    assert SECURITY <= set(r.headers)


def test_integral_floats_are_integers(client):
    """JSON Schema's integer includes 8.0; the strict body models read it as 8."""
    r = client.post("/api/estimate", json={"inputs": {"model": "llama-3.2-1b", "gpus": 8.0, "zero": 3.0}})
    assert r.status_code == 200, r.text
    assert r.json()["estimate"]["plan"]["gpus"] == 8
    assert client.post("/api/estimate", json={"inputs": {"gpus": 8.5}}).json()["field"] == "gpus"


def test_framework_errors_have_the_same_shape(client):
    r = client.post("/api/estimate", content=b'{"config_json": "\\ud800"', headers={"content-type": "application/json"})
    assert r.status_code in (400, 422) and set(r.json()) == {"error", "field"}
    for r in (client.get("/api/nope"), client.put("/api/estimate", json={})):
        assert r.status_code in (404, 405) and set(r.json()) == {"error", "field"}


def test_security_headers_everywhere(client):
    for path in ("/", "/static/app.js", "/static/app.css", "/api/gpus", "/openapi.json", "/nope"):
        r = client.get(path)
        assert SECURITY <= set(r.headers), path
        csp = r.headers["content-security-policy"]
        assert "unsafe-inline" not in csp and "frame-ancestors 'none'" in csp
        assert r.headers["x-content-type-options"] == "nosniff"
    page = client.get("/").text
    assert "<script>" not in page and "style=" not in page and "http" not in page.replace("http-equiv", "")


def test_host_header_guard():
    c = TestClient(create_app(allowed_hosts=["127.0.0.1", "localhost"]), base_url="http://127.0.0.1")
    assert c.get("/api/gpus").status_code == 200
    assert c.get("/api/gpus", headers={"host": "attacker.example"}).status_code == 400


def test_request_time_limit(monkeypatch):
    from trainledger.web import service

    monkeypatch.setattr(service, "gpus", lambda: time.sleep(1.0) or [])
    c = TestClient(create_app(timeout_s=0.1))
    t0 = time.perf_counter()
    r = c.get("/api/gpus")
    assert r.status_code == 503 and "longer than" in r.json()["error"]
    assert time.perf_counter() - t0 < 0.9


def test_plan_endpoint_matches_the_planner(client):
    from trainledger.planner.search import Job, search

    job = {"model": "llama-3.2-1b", "tokens": 1e9, "deadline_days": 1, "gpus": ["h100-sxm", "l40s"], "max_gpus": 16}
    r = client.post("/api/plan", json=job)
    assert r.status_code == 200, r.text
    body = r.json()
    want = search(Job(**{**job, "gpus": tuple(job["gpus"]), "max_gpus": 16})).to_dict()
    assert body["count"] == len(want["plans"]) and body["rejected_count"] == len(want["rejected"])
    assert [(p["gpu"], p["gpus"]) for p in body["result"]["plans"]] == [(p["gpu"], p["gpus"]) for p in want["plans"]]
    tables = [b for b in body["blocks"] if b["kind"] == "table"]
    assert len(tables[0]["rows"]) == len(want["plans"])
    assert client.post("/api/plan", json={"gpus": ["nope"]}).json()["field"] == "plan_gpus"


def test_plan_endpoint_takes_the_deadline_quantile(client):
    from trainledger.planner.search import Job, search

    job = {"model": "llama-3.2-1b", "tokens": 20e9, "deadline_days": 1, "gpus": ["h100-sxm"], "max_gpus": 64,
           "deadline_quantile": "p90"}
    body = client.post("/api/plan", json=job).json()
    want = search(Job(**{**job, "gpus": tuple(job["gpus"])})).to_dict()
    assert want["job"]["deadline_quantile"] == "p90"
    assert [(p["gpu"], p["gpus"]) for p in body["result"]["plans"]] == [(p["gpu"], p["gpus"]) for p in want["plans"]]
    assert client.post("/api/plan", json={**job, "deadline_quantile": "p99"}).json()["field"] == "deadline_quantile"


def test_report_and_export_downloads(client):
    r = client.post("/api/report", json={"inputs": {"model": "llama-3.2-1b", "gpu": "l40s"}})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert 'attachment; filename="trainledger-report-llama-3.2-1b.html"' == r.headers["content-disposition"]
    est = estimate(build_plan(PlanInputs(model="llama-3.2-1b", gpu="l40s"))).to_dict()
    assert f"{est['memory']['device_total_bytes'] / 2**30:,.2f} GiB" in r.text
    md = client.post("/api/report", json={"inputs": {"model": "llama-3.2-1b"}, "format": "md"})
    assert md.text.startswith("# llama-3.2-1b")
    from trainledger.runconfig import export_plan

    # deepspeed.json runs the job under DeepSpeed: the plan says so (issue 17: exports keep the stack)
    ex = client.post("/api/export", json={"inputs": {"model": "llama-3.1-8b", "gpus": 8, "framework": "deepspeed"},
                                          "format": "deepspeed"})
    assert ex.status_code == 200
    want = export_plan(PlanInputs(model="llama-3.1-8b", gpus=8, framework="deepspeed"), "deepspeed")
    assert [f["name"] for f in ex.json()["files"]] == [f.name for f in want]
    assert client.post("/api/export", json={"format": "nope"}).json()["field"] == "export_format"


def test_openapi_schema_lists_the_api(client):
    spec = client.get("/openapi.json").json()
    assert {"/api/presets", "/api/gpus", "/api/options", "/api/estimate", "/api/plan", "/api/report",
            "/api/export"} <= set(spec["paths"])
    for path in ("/api/estimate", "/api/plan", "/api/report", "/api/export"):
        responses = spec["paths"][path]["post"]["responses"]
        for code in ("400", "422", "413", "503"):  # errors are documented as they are sent
            assert responses[code]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")
    props = spec["components"]["schemas"]["WebInputs"]["properties"]
    assert "corpus" not in props and props["gpus"]["maximum"] > 1


def test_serve_command_defaults_to_loopback(monkeypatch):
    from click.testing import CliRunner

    import trainledger.web as web
    from trainledger.cli import main

    calls = []
    monkeypatch.setattr(web, "serve", lambda host, port: calls.append((host, port)))
    r = CliRunner().invoke(main, ["serve"])
    assert r.exit_code == 0 and calls == [("127.0.0.1", 8765)]
    assert "http://127.0.0.1:8765/" in r.output
    r = CliRunner().invoke(main, ["serve", "--host", "0.0.0.0", "--port", "9000"])
    assert calls[-1] == ("0.0.0.0", 9000) and "warning: serving on 0.0.0.0" in r.output
    assert web.loopback_hosts("127.0.0.1", 1) and web.loopback_hosts("0.0.0.0", 1) is None


def test_missing_web_extra_names_the_pip_command(monkeypatch):
    import sys

    from click.testing import CliRunner

    from trainledger.cli import main

    monkeypatch.setitem(sys.modules, "uvicorn", None)  # import uvicorn -> ImportError
    r = CliRunner().invoke(main, ["serve", "--port", "0"])
    assert r.exit_code != 0
    assert "pip install 'trainledger[web]'" in r.output and "Traceback" not in r.output
