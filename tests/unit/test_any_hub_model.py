"""Any Hub architecture transformers knows is built on the meta device; Hub look-ups are bounded."""

from __future__ import annotations

import importlib.util
import json
import time

import pytest

from trainledger.load import hf as hfconfig
from trainledger.errors import CatalogError, SpecError
from trainledger.load.hf import load_model

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=500)


def _config(tmp_path, model_type: str, **kw):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.AutoConfig.for_model(model_type, **kw)
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg.to_dict()))
    return p, cfg


@pytest.mark.parametrize("model_type,extra", [("granite", {"num_key_value_heads": 2}),
                                              ("starcoder2", {"num_key_value_heads": 2}),
                                              ("olmo", {}), ("cohere", {}), ("stablelm", {"num_key_value_heads": 4})])
def test_unsupported_model_type_counts_match_the_real_model(tmp_path, model_type, extra):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    p, cfg = _config(tmp_path, model_type, **TINY, **extra)
    spec = load_model(p)
    with torch.device("meta"):
        real = transformers.AutoModelForCausalLM.from_config(cfg)
    assert spec.params.total == sum(x.numel() for x in real.parameters())
    assert spec.model_type == model_type and spec.num_layers == 2
    assert any("meta device" in n for n in spec.notes)


def test_architecture_with_parts_not_modeled_is_refused_with_the_counts(tmp_path):
    pytest.importorskip("torch")
    # Mamba's selective state-space mixer is not an attention/MLP decoder layer: its parameters can
    # never match the structure we read (falcon, used before, matches from transformers 5.25 on)
    p, _ = _config(tmp_path, "mamba", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                   vocab_size=500)
    with pytest.raises(SpecError, match="parameters; the structure read from it gives"):
        load_model(p)


def test_core_install_names_the_extra(tmp_path, monkeypatch):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"model_type": "granite", **TINY}))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n in ("torch", "transformers") else real(n, *a))
    with pytest.raises(SpecError, match=r"pip install 'trainledger\[verify\]'"):
        load_model(p)


def test_unreachable_hub_is_one_bounded_attempt(monkeypatch, capsys, tmp_path):
    hub = pytest.importorskip("huggingface_hub")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hfconfig, "HUB_TIMEOUT_S", 1.0)
    calls = []

    def stalled(*a, **k):
        calls.append(1)
        time.sleep(30)

    monkeypatch.setattr(hub, "hf_hub_download", stalled)
    t0 = time.perf_counter()
    with pytest.raises(CatalogError, match="HF_HUB_OFFLINE") as exc:
        load_model("someone/not-cached-model")
    assert time.perf_counter() - t0 < 3 and len(calls) == 1
    assert str(tmp_path / "hub") in str(exc.value) and "\n" not in str(exc.value)
    assert capsys.readouterr().err == ""


def test_hub_that_answers_not_found_is_an_unknown_model(monkeypatch, tmp_path):
    hub = pytest.importorskip("huggingface_hub")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)

    class RepositoryNotFoundError(Exception):
        pass

    def missing(*a, **k):
        raise RepositoryNotFoundError("404 Client Error: Repository Not Found")

    monkeypatch.setattr(hub, "hf_hub_download", missing)
    with pytest.raises(CatalogError, match="not in the local cache"):
        load_model("someone/no-such-model")
