"""`trainledger corpus` end to end, --sample, and the stats JSON feeding a plan (--corpus)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from trainledger.cli import main
from trainledger.corpus import CorpusOptions, analyze, plan_hints
from trainledger.errors import CorpusError
from trainledger.load.plan import PlanInputs, parse_inputs

from corpus_fixtures import make_texts


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    texts = make_texts(3000, seed=3)
    path = d / "train.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    return path, texts


def invoke(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result


def test_json_output_names_its_statistics(corpus, tok_path, tok):
    path, texts = corpus
    r = invoke("corpus", path, "--tokenizer", tok_path, "--micro-batch", 4, "--seq-len", 256, "--json", "-q")
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    for key in ("samples", "total_tokens", "mean", "median", "p90", "p95", "p99", "max", "std", "histogram",
                "truncation", "padding", "recommendation", "approximate"):
        assert key in s, key
    a = np.array([len(tok.encode(t).ids) for t in texts])
    assert s["total_tokens"] == a.sum() and s["p99"] == pytest.approx(np.percentile(a, 99))
    assert s["seq_len"] == 256 and s["seq_len_source"] == "given" and s["micro_batch"] == 4
    assert s["truncation"]["samples"] == (a > 256).sum()
    assert set(s["padding"]) == {"pad_to_max", "pad_to_longest", "bucketed", "packing"}
    assert s["recommendation"]["seq_len"] % 64 == 0 and s["recommendation"]["seq_len"] >= np.percentile(a, 99)


def test_text_output_and_approximation_warning(corpus):
    path, texts = corpus
    r = invoke("corpus", path, "-q")
    assert r.exit_code == 0, r.output
    assert "ESTIMATE" in r.stdout and "p99" in r.stdout and "█" in r.stdout and "recommended:" in r.stdout
    assert "warning: token counts are an ESTIMATE (1 token per 4 characters)" in r.stderr
    r = invoke("corpus", path, "-q", "--json", "--chars-per-token", "3")
    s = json.loads(r.stdout)
    assert s["approximate"] is True and s["tokenizer"]["chars_per_token"] == 3
    assert s["total_tokens"] == sum(math.ceil(len(t) / 3) for t in texts)


def test_user_errors_are_one_line(tmp_path):
    r = invoke("corpus", tmp_path / "none.jsonl")
    assert r.exit_code == 2 and r.stderr.startswith("error: ") and "Traceback" not in r.output
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a"}\n{oops\n')
    r = invoke("corpus", bad, "--on-error", "fail")
    assert r.exit_code == 2 and f"{bad}:2: not valid JSON" in r.stderr
    r = invoke("corpus", bad, "--micro-batch", 0)
    assert r.exit_code == 2


def test_sample_gives_an_interval_around_the_full_count(corpus, tok_path):
    path, _ = corpus
    full = analyze([str(path)], CorpusOptions(tokenizer=str(tok_path), workers=1))
    part = analyze([str(path)], CorpusOptions(tokenizer=str(tok_path), workers=1, sample=600, seed=4))
    samp = part["sampling"]
    assert samp["population_records"] == 3000 and 450 < part["samples"] < 750
    lo, hi = samp["confidence"]["total_tokens"]
    assert lo < part["total_tokens"] < hi
    assert lo < full["total_tokens"] < hi
    # the draw depends on the seed, not on how many processes read the file
    one, two = (analyze([str(path)], CorpusOptions(tokenizer=str(tok_path), workers=w, sample=600, seed=4,
                                                   chunk_bytes=16384)) for w in (1, 2))
    assert two["throughput"]["workers"] == 2
    assert (one["samples"], one["total_tokens"], one["p99"]) == (two["samples"], two["total_tokens"], two["p99"])
    assert any("random sample" in w for w in part["warnings"])


def test_plan_hints_and_plan_inputs(corpus, tok_path, tmp_path):
    path, _ = corpus
    r = invoke("corpus", path, "--tokenizer", tok_path, "--micro-batch", 8, "--json", "-q")
    stats_file = tmp_path / "stats.json"
    stats_file.write_text(r.stdout)
    s = json.loads(r.stdout)
    h = plan_hints(stats_file)
    row = s["padding"][s["recommendation"]["strategy"]]
    assert h["seq_len"] == s["seq_len"] == s["recommendation"]["seq_len"]
    assert h["tokens"] == round(row["padded_tokens"]) and h["total_tokens"] == round(row["real_tokens"])
    assert h["padding_fraction"] == pytest.approx(1 - h["total_tokens"] / h["tokens"], abs=1e-9)
    assert h["tokens_per_sample_effective"] == pytest.approx(h["tokens"] / h["sequences"])
    inputs = parse_inputs({"corpus": str(stats_file)})
    assert inputs.seq_len == h["seq_len"] and inputs.tokens == h["tokens"]
    explicit = parse_inputs({"corpus": str(stats_file), "seq_len": 8192, "tokens": 1e9})
    assert explicit.seq_len == 8192 and explicit.tokens == 1e9
    assert isinstance(inputs, PlanInputs)
    (tmp_path / "other.json").write_text('{"a": 1}')
    with pytest.raises(CorpusError, match="not the JSON output of `trainledger corpus --json`"):
        parse_inputs({"corpus": str(tmp_path / "other.json")})


def test_plan_command_takes_seq_len_and_tokens_from_corpus(corpus, tok_path, tmp_path):
    if main.get_command(None, "plan") is None:
        pytest.skip("plan command not present")
    path, _ = corpus
    stats_file = tmp_path / "stats.json"
    stats_file.write_text(invoke("corpus", path, "--tokenizer", tok_path, "--json", "-q").stdout)
    hints = plan_hints(stats_file)
    r = invoke("plan", "--corpus", stats_file, "--model", "llama-3.2-1b", "--gpu", "h100-sxm", "--max-gpus", 8,
               "--json")
    assert r.exit_code == 0, r.output
    job = json.loads(r.stdout)["job"]
    assert job["seq_len"] == hints["seq_len"] and job["tokens"] == hints["tokens"]


def test_estimate_accepts_corpus(corpus, tok_path, tmp_path):
    if main.get_command(None, "estimate") is None:
        pytest.skip("estimate command not present")
    path, _ = corpus
    stats_file = tmp_path / "stats.json"
    stats_file.write_text(invoke("corpus", path, "--tokenizer", tok_path, "--json", "-q").stdout)
    r = invoke("estimate", "--corpus", stats_file, "--model", "llama-3.2-1b", "--json")
    assert r.exit_code == 0, r.output
    assert str(plan_hints(stats_file)["seq_len"]) in r.stdout
