"""Fuzz the web API from its own OpenAPI schema with schemathesis, in-process (ASGI, no socket).

Every operation of ``/openapi.json`` gets schema-valid and schema-violating requests; the checks
are schemathesis' defaults (no 5xx, status codes, content types and response bodies as documented,
invalid requests rejected). Examples are bounded and derandomized for CI. Plus the rules of
issue 9 that a schema cannot show: a body-size limit, a time limit, security headers on the page,
no client-named file is read, and the server binds to 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import json
import os

import pytest

schemathesis = pytest.importorskip("schemathesis")
pytest.importorskip("fastapi")

from hypothesis import HealthCheck, settings  # noqa: E402

from trainledger.web.app import MAX_BODY_BYTES, create_app  # noqa: E402

#: examples per API operation (7 operations): keeps this file near a minute on 2 cores
EXAMPLES = int(os.environ.get("TRAINLEDGER_FUZZ_EXAMPLES", "40"))

APP = create_app(timeout_s=10.0)
#: a schema-valid request may still name a plan that cannot run (an unknown provider, degrees that
#: do not divide the GPUs): the API answers 400 with {error, field}, as its schema documents, or
#: 503 past the time limit. Everything else schemathesis checks by default (no 5xx otherwise,
#: documented status codes, content types and bodies, invalid data rejected with 4xx).
CONFIG = schemathesis.config.SchemathesisConfig.from_dict(
    {"checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", "400", "503"]},
                # a schema-violating body over the size limit is rejected before it is parsed
                "negative_data_rejection": {"expected-statuses": ["400", "413", "422"]}},
     # the coverage phase mislabels some boundary bodies (nested, exclusiveMinimum) as valid
     # (schemathesis/schemathesis#3155, #4308); the examples and fuzzing phases run in full
     "phases": {"coverage": {"enabled": False}}})
schema = schemathesis.openapi.from_asgi("/openapi.json", APP, config=CONFIG)


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
def test_api_conforms_to_its_schema(case):
    response = case.call_and_validate()
    log = os.environ.get("TRAINLEDGER_FUZZ_LOG")  # bench/fuzz_report.py counts the cases
    if log:
        with open(log, "a") as f:
            f.write(json.dumps({"op": case.operation.label, "status": response.status_code}) + "\n")


@pytest.fixture(scope="module")
def client():
    from fastapi.testclient import TestClient

    return TestClient(APP)


def test_oversized_and_lying_bodies_are_refused(client):
    big = b'{"inputs": {"model": "' + b"x" * (MAX_BODY_BYTES + 10) + b'"}}'
    r = client.post("/api/estimate", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]
    r = client.post("/api/estimate", content=b"{}", headers={"content-type": "application/json",
                                                             "content-length": "-5"})
    assert r.status_code in (400, 413)


@pytest.mark.parametrize("body", [
    b"[" * 100_000 + b"]" * 100_000,
    b'{"inputs": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
    b'{"inputs": {"gpus": 1e400}}',
    b'{"inputs": {"gpus": NaN}}',
    b'{"inputs": {"seq_len": ' + b"9" * 5000 + b"}}",
    b"\xff\xfe\x00garbage",
])
def test_hostile_json_bodies_are_4xx(client, body):
    r = client.post("/api/estimate", content=body, headers={"content-type": "application/json"})
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
    assert r.json()["error"]


@pytest.mark.parametrize("config", [
    '{"model_type": "llama", "hidden_size": ' + "9" * 5000 + "}",
    "[" * 50_000 + "]" * 50_000,
    '{"model_type": ' + "[" * 30_000 + "]" * 30_000 + "}",
    '{"model_type": "llama", "auto_map": {"AutoModelForCausalLM": "evil.Model"}, "hidden_size": NaN}',
    '{"model_type": ["llama"]}',
])
def test_hostile_pasted_config_is_4xx(client, config):
    r = client.post("/api/estimate", json={"config_json": config})
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
    assert len(r.json()["error"]) < 2000


@pytest.mark.parametrize("name", ["/etc/passwd", "../../../../etc/passwd", "/dev/zero",
                                  "tiny.json", "C:\\boot.ini", "~/.ssh/id_rsa", "a" * 101])
def test_client_named_files_are_never_opened(monkeypatch, name):
    """Model/GPU names that look like paths are refused before any file is touched."""
    from fastapi.testclient import TestClient

    # in-process threads (isolate=False): the spies below see what a request's worker opens
    client = TestClient(create_app(timeout_s=10.0, isolate=False))
    import builtins
    import io as _io

    from trainledger.load import catalog

    opened: list[str] = []
    real_open, real_io_open, real_read = builtins.open, _io.open, catalog.read_data_file

    def spy(path, *a, **k):
        opened.append(str(path))
        return real_open(path, *a, **k)

    def spy_read(path):
        opened.append(str(path))
        return real_read(path)

    monkeypatch.setattr(builtins, "open", spy)
    monkeypatch.setattr(catalog, "read_data_file", spy_read)
    for body in ({"inputs": {"model": name}}, {"inputs": {"gpu": name}},
                 {"inputs": {"network": name, "gpus": 16}}):
        r = client.post("/api/estimate", json=body)
        assert 400 <= r.status_code < 500, (body, r.status_code)
    r = client.post("/api/plan", json={"model": name, "max_gpus": 1, "gpus": ["h100-sxm"]})
    assert 400 <= r.status_code < 500
    r = client.post("/api/plan", json={"model": "tiny-llama-debug", "max_gpus": 1, "gpus": [name]})
    assert 400 <= r.status_code < 500
    named = [p for p in opened if name.strip("~./\\") and name.strip("~./\\")[:20] in p]
    assert not named, f"opened a client-named file: {named[:3]}"
    assert real_io_open is _io.open


def test_page_has_security_headers(client):
    r = client.get("/")
    assert r.status_code == 200
    h = {k.lower(): v for k, v in r.headers.items()}
    assert "unsafe-inline" not in h["content-security-policy"]
    assert "frame-ancestors 'none'" in h["content-security-policy"]
    assert h["x-content-type-options"] == "nosniff"
    assert h["x-frame-options"] == "DENY"
    assert h["referrer-policy"] == "no-referrer"


def test_serve_binds_loopback_by_default():
    from click.testing import CliRunner

    from trainledger.cli import main

    r = CliRunner().invoke(main, ["serve", "--help"])
    assert r.exit_code == 0
    assert "127.0.0.1" in r.output


@pytest.mark.parametrize("prices", [{"price_per_gpu_hour": 5e-324}, {"price_per_gpu_hour": 1000}])
def test_extreme_prices_are_not_a_500(client, prices):
    """Found by the fuzzer: a denormal price made the chart ticks raise StopIteration (HTTP 500)."""
    r = client.post("/api/estimate", json={"inputs": {"model": "tiny-llama-debug", "tokens": 1e9},
                                           "prices": prices})
    assert r.status_code == 200, r.text[:300]
