"""Reading configs: presets, files, Hub ids (cache only, offline), family details, bad input, CLI."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from trainledger.cli import main
from trainledger.errors import CatalogError, SpecError
from trainledger.load.hf import from_hf_config, load_hf_config, load_model, preset_names

TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256}


def write(tmp_path, data, name="config.json"):
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else json.dumps(data))
    return p


# ------------------------------------------------------------------ finding configs
def test_unknown_preset_suggests_close_names():
    with pytest.raises(CatalogError, match=r"unknown model 'llama-3-8b'.*Did you mean: .*llama-3\.1-8b"):
        load_model("llama-3-8b")


def test_preset_names_are_lowercase_with_dashes():
    for n in preset_names():
        assert n == n.lower() and " " not in n and "_" not in n


def test_hub_id_of_a_bundled_preset_works_offline():
    spec = load_model("meta-llama/Llama-3.1-8B")
    assert spec.name == "llama-3.1-8b" and spec.source == "meta-llama/Llama-3.1-8B"
    assert load_model("qwen/qwen2.5-7b").params.total == load_model("qwen2.5-7b").params.total


def test_hub_id_from_local_hf_cache(tmp_path, monkeypatch):
    pytest.importorskip("huggingface_hub")
    repo = tmp_path / "models--someorg--tiny-model"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0123abcd")
    snap = repo / "snapshots" / "0123abcd"
    snap.mkdir(parents=True)
    write(snap, dict(TINY, auto_map={"AutoModelForCausalLM": "evil.Model"}))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec = load_model("someorg/tiny-model")
    assert spec.source == "someorg/tiny-model" and spec.num_layers == 2
    assert load_hf_config("someorg/tiny-model")["hidden_size"] == 64


def test_uncached_hub_id_offline_says_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(CatalogError, match="not in the local cache and the Hub is offline"):
        load_model("nobody/no-such-model")


def test_config_file_and_folder(tmp_path):
    p = write(tmp_path, TINY)
    assert load_model(p).params.total == load_model(tmp_path).params.total
    assert load_model(str(p)).source == str(p)


def test_load_hf_config_drops_preset_metadata():
    cfg = load_hf_config("gpt3-175b")
    assert "_source" not in cfg and "_note" not in cfg and cfg["model_type"] == "generic"


def test_auto_map_is_ignored():
    spec = load_model("phi-3-mini")  # its real config.json carries auto_map -> remote code
    assert spec.model_type == "phi3" and spec.fused_qkv


# ------------------------------------------------------------------ family details
def test_layer_types_per_family():
    g2 = load_model("gemma-2-9b")
    assert [g2.is_sliding_layer(i) for i in range(4)] == [True, False, True, False]
    g3 = load_model("gemma-3-1b")
    assert [g3.is_sliding_layer(i) for i in range(12)] == ([True] * 5 + [False]) * 2
    assert g3.sliding_window == 512
    assert load_model("qwen2.5-7b").sliding_window is None  # use_sliding_window is false
    m = load_model("mistral-7b-v0.1")
    assert m.sliding_window == 4096 and all(m.is_sliding_layer(i) for i in range(m.num_layers))
    assert load_model("mistral-7b-v0.3").sliding_window is None


def test_qwen2_sliding_window_starts_at_max_window_layers():
    spec = from_hf_config(dict(TINY, model_type="qwen2", num_hidden_layers=4, use_sliding_window=True,
                               sliding_window=32, max_window_layers=2))
    assert spec.layer_types == ("full", "full", "sliding", "sliding")


def test_gemma3_multimodal_uses_text_config_and_its_defaults():
    spec = load_model("gemma-3-4b")
    assert (spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.vocab_size) == (8, 4, 256, 262_208)
    assert spec.qk_norm == "head" and spec.norms_per_layer == 4 and spec.tie_word_embeddings
    assert any("vision" in n for n in spec.notes)


def test_family_defaults_for_missing_optional_keys():
    qwen3 = from_hf_config({k: v for k, v in TINY.items()} | {"model_type": "qwen3"})
    assert qwen3.head_dim == 128  # Qwen3Config default, not hidden/heads
    gpt2 = from_hf_config({"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 100})
    assert gpt2.intermediate_size == 256 and gpt2.tie_word_embeddings and gpt2.max_position_embeddings == 1024


def test_mla_and_moe_fields_of_deepseek_v3():
    spec = load_model("deepseek-v3")
    assert spec.mla.kv_lora_rank == 512 and spec.mla.q_lora_rank == 1536
    assert spec.moe.num_experts == 256 and spec.moe.top_k == 8 and spec.moe.first_dense_layers == 3
    assert (spec.moe.num_groups, spec.moe.topk_groups) == (8, 4)
    assert spec.q_dim == 128 * 192


# ------------------------------------------------------------------ bad input
def test_malformed_json_names_the_file(tmp_path):
    p = write(tmp_path, '{"model_type": "llama", "hidden_size": 64,')
    with pytest.raises(SpecError, match=rf"{p}: not valid JSON"):
        load_model(p)


def test_json_that_is_not_an_object(tmp_path):
    p = write(tmp_path, "[1, 2, 3]")
    with pytest.raises(SpecError, match=rf"{p}: expected a JSON object"):
        load_model(p)


@pytest.mark.parametrize("key,value,what", [
    ("hidden_size", "4096", "an integer"),
    ("num_hidden_layers", True, "an integer"),
    ("num_hidden_layers", -1, r"an integer in \[1"),
    ("vocab_size", 10**12, r"an integer in \[1"),
    ("intermediate_size", 0, r"an integer in \[1"),
    ("tie_word_embeddings", "yes", "true or false"),
    ("num_key_value_heads", 3.5, "an integer"),
])
def test_wrong_types_and_sizes_name_file_and_field(tmp_path, key, value, what):
    p = write(tmp_path, dict(TINY, **{key: value}))
    with pytest.raises(SpecError, match=rf"{p}: field '{key}' must be {what}"):
        load_model(p)


@pytest.mark.parametrize("key", ["hidden_size", "intermediate_size", "num_hidden_layers", "vocab_size"])
def test_missing_required_field(tmp_path, key):
    p = write(tmp_path, {k: v for k, v in TINY.items() if k != key})
    with pytest.raises(SpecError, match=rf"{p}: missing field '{key}'"):
        load_model(p)


def test_unsupported_or_missing_model_type(tmp_path):
    # a model_type without a built-in reader goes to transformers on the meta device (issue 17):
    # one transformers does not know is refused, remote code is never run
    with pytest.raises(SpecError, match=r"model_type 'no_such_arch' is not supported: it is not built into transformers"):
        from_hf_config(dict(TINY, model_type="no_such_arch"), name="x.json")
    with pytest.raises(SpecError, match="the field is missing"):
        from_hf_config({k: v for k, v in TINY.items() if k != "model_type"}, name="x.json")


def test_inconsistent_heads():
    with pytest.raises(SpecError, match="not a multiple of num_key_value_heads 3"):
        from_hf_config(dict(TINY, num_key_value_heads=3), name="x.json")
    with pytest.raises(SpecError, match="not divisible by num_attention_heads 5; give head_dim"):
        from_hf_config(dict(TINY, num_attention_heads=5, num_key_value_heads=5), name="x.json")


def test_generic_choices_and_required_keys():
    base = dict(TINY, model_type="generic")
    with pytest.raises(SpecError, match=r"field 'mlp_type' must be one of gated, plain \(got 'swiglu'\)"):
        from_hf_config(dict(base, mlp_type="swiglu"), name="g.json")
    with pytest.raises(SpecError, match="missing field 'max_position_embeddings'"):
        from_hf_config(dict(base, position_embedding="learned"), name="g.json")
    spec = from_hf_config(dict(base, norm_type="layernorm", bias=True, position_embedding="alibi"))
    assert spec.norm_bias and spec.qkv_bias and spec.mlp_bias and not spec.lm_head_bias


def test_moe_inconsistencies():
    moe = dict(TINY, model_type="qwen3_moe", num_experts=4, moe_intermediate_size=16)
    with pytest.raises(SpecError, match="top_k 8 exceeds num_experts 4"):
        from_hf_config(dict(moe, num_experts_per_tok=8), name="m.json")
    with pytest.raises(SpecError, match="field 'moe_layer_freq' must be 1"):
        from_hf_config(dict(load_hf_config("tiny-deepseek-v3-debug"), moe_layer_freq=2), name="d.json")


# ------------------------------------------------------------------ CLI
def test_cli_model_show_json_for_moe():
    r = CliRunner().invoke(main, ["model", "show", "qwen3-30b-a3b", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    p = d["params"]
    assert isinstance(p["total"], int) and p["total"] == sum(p["breakdown"].values())
    assert set(p["breakdown"]) >= {"embedding", "attention", "experts", "router", "norms", "lm_head"}
    assert 0 < p["active"] < p["total"]


def test_cli_model_show_text_and_errors(tmp_path):
    r = CliRunner().invoke(main, ["model", "show", "llama-2-7b"])
    assert r.exit_code == 0 and "6,738,415,616" in r.output
    r = CliRunner().invoke(main, ["model", "show", "qwen2.5-7"])
    assert r.exit_code != 0 and "Did you mean" in r.output and "Traceback" not in r.output
    bad = write(tmp_path, '{"model_type": ')
    r = CliRunner().invoke(main, ["model", "show", str(bad)])
    assert r.exit_code != 0 and len(r.output.strip().splitlines()) == 1 and str(bad) in r.output


def test_cli_models_filter_and_family():
    r = CliRunner().invoke(main, ["models", "--family", "gpt2", "--json"])
    names = [m["name"] for m in json.loads(r.output)["models"]]
    assert sorted(names) == ["gpt2", "gpt2-large", "gpt2-medium", "gpt2-xl", "tiny-gpt2-debug"]
    r = CliRunner().invoke(main, ["models", "Qwen/Qwen3"])  # filter also matches the Hub id
    assert r.exit_code == 0 and "qwen3-235b-a22b" in r.output and "llama" not in r.output


def test_mla_key_and_value_widths():
    """transformers' DeepseekV3Attention expands the latent into per-head k (nope+rope) and v."""
    spec = load_model("deepseek-v3")
    assert (spec.kv_dim, spec.v_dim) == (128 * (128 + 64), 128 * 128)
    llama = load_model("llama-3.1-8b")
    assert llama.kv_dim == llama.v_dim == 8 * 128
