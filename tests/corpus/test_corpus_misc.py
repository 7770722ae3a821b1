"""Tokenizer lookup in the Hub cache, lazy imports, the progress bar."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys

from trainledger.corpus import CorpusOptions, analyze
from trainledger.corpus.progress import ProgressBar
from trainledger.corpus.tokenizer import locate_tokenizer


def test_cached_hub_tokenizer(tmp_path, monkeypatch, tok_dir, tok, texts):
    repo = tmp_path / "hub" / "models--org--tiny"
    snap = repo / "snapshots" / "0123abc"
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abc")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tok_dir / name, snap / name)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert locate_tokenizer("org/tiny") == snap / "tokenizer.json"
    data = tmp_path / "a.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[:20]))
    stats = analyze([str(data)], CorpusOptions(tokenizer="org/tiny", workers=1))
    assert stats["total_tokens"] == sum(len(tok.encode(t).ids) for t in texts[:20])


def test_importing_corpus_loads_no_heavy_library():
    code = ("import sys, trainledger.corpus, trainledger.cli.corpus_cmd; "
            "print([m for m in ('tokenizers', 'pyarrow', 'zstandard', 'jinja2') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_progress_bar_shows_rate_and_eta():
    buf = io.StringIO()
    bar = ProgressBar("corpus", stream=buf, enabled=True)
    bar(50 << 20, 100 << 20)
    bar(100 << 20, 100 << 20)
    bar.close()
    out = buf.getvalue()
    assert "50.0%" in out and "100.0%" in out and "ETA 0:00:" in out and "MB/s" in out and out.endswith("\n")
    quiet = io.StringIO()
    ProgressBar(stream=quiet)(1, 2)  # not a terminal: nothing drawn
    assert quiet.getvalue() == ""
