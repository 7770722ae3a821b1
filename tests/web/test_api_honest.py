"""Issue 18 at the API: the page's planner, export and panel use the same job as each other."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from trainledger.load.hf import load_hf_config  # noqa: E402
from trainledger.web import create_app  # noqa: E402


@pytest.fixture(scope="module")
def client():
    return TestClient(create_app())


def test_planner_uses_the_methods_default_precision_like_the_panel(client):
    job = {"model": "qwen2.5-0.5b", "method": "lora", "tokens": 1e8, "gpus": ["h100-sxm"], "max_gpus": 1}
    r = client.post("/api/plan", json=job)
    assert r.status_code == 200, r.text
    panel = client.post("/api/estimate", json={"inputs": {"model": "qwen2.5-0.5b", "method": "lora"}}).json()
    assert r.json()["result"]["job"]["precision"] == panel["estimate"]["plan"]["precision"] == "bf16"


def test_planner_and_export_use_a_pasted_config(client):
    cfg = json.dumps(load_hf_config("qwen2.5-0.5b"))
    r = client.post("/api/plan", json={"model": "llama-3.1-8b", "config_json": cfg, "tokens": 1e8,
                                        "gpus": ["l40s"], "max_gpus": 1})
    assert r.status_code == 200, r.text
    assert r.json()["result"]["job"]["model"] == "config.json" and r.json()["count"] >= 1
    r = client.post("/api/export", json={"inputs": {"model": "llama-3.1-8b"}, "config_json": cfg, "format": "torchrun"})
    assert r.status_code == 200, r.text
    assert "llama-3.1-8b" not in r.json()["files"][0]["text"]


def test_ranking_by_time_without_a_token_budget_is_refused_at_the_tokens_field(client):
    r = client.post("/api/plan", json={"model": "qwen2.5-0.5b", "rank_by": "time"})
    assert r.status_code == 400 and r.json()["field"] == "tokens"
