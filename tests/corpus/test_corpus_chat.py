"""Chat records through the tokenizer's template, ShareGPT and prompt/response pairs, the fallback."""

from __future__ import annotations

import json
import shutil

import pytest

from trainledger.corpus import CorpusOptions, analyze

CONVERSATIONS = [
    [{"role": "system", "content": "be brief"}, {"role": "user", "content": "kalo mi ten"},
     {"role": "assistant", "content": "rasun vo e tri"}],
    [{"role": "user", "content": "dal qu ix"}, {"role": "assistant", "content": "naï ß 日本 kalo"}],
]


def rendered(messages) -> str:
    """What CHAT_TEMPLATE (conftest) produces, written out by hand."""
    return "<s>" + "".join(f"<|{m['role']}|>{m['content']}\n" for m in messages) + "</s>"


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def _run(path, tok, **kw):
    return analyze([str(path)], CorpusOptions(tokenizer=str(tok), workers=1, **kw))


def test_messages_use_the_chat_template(tmp_path, tok_dir, tok):
    path = _jsonl(tmp_path / "chat.jsonl", [{"messages": m} for m in CONVERSATIONS])
    stats = _run(path, tok_dir)
    want = [len(tok.encode(rendered(m), add_special_tokens=False).ids) for m in CONVERSATIONS]
    assert stats["total_tokens"] == sum(want) and stats["max"] == max(want)
    assert stats["chat_records"] == 2 and "tokenizer_config.json" in stats["tokenizer"]["chat"]
    assert not any("fallback" in w for w in stats["warnings"])


def test_sharegpt_and_prompt_response_pairs(tmp_path, tok_dir, tok):
    share = [{"conversations": [{"from": "human", "value": "kalo"}, {"from": "gpt", "value": "mi ten"}]}]
    pairs = [{"prompt": "kalo", "response": "mi ten"}, {"instruction": "kalo", "input": "", "output": "mi ten"}]
    path = _jsonl(tmp_path / "mixed.jsonl", share + pairs)
    stats = _run(path, tok_dir)
    msgs = [{"role": "user", "content": "kalo"}, {"role": "assistant", "content": "mi ten"}]
    one = len(tok.encode(rendered(msgs), add_special_tokens=False).ids)
    assert stats["samples"] == 3 and stats["total_tokens"] == 3 * one


def test_chat_column_in_parquet(tmp_path, tok_dir, tok):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"messages": CONVERSATIONS, "id": [1, 2]}), str(tmp_path / "c.parquet"))
    stats = _run(tmp_path / "c.parquet", tok_dir, fields=("messages",))
    assert stats["total_tokens"] == sum(len(tok.encode(rendered(m), add_special_tokens=False).ids)
                                        for m in CONVERSATIONS)


def test_fallback_without_template_is_reported(tmp_path, tok_path, tok):
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(tok_path, bare / "tokenizer.json")
    path = _jsonl(tmp_path / "chat.jsonl", [{"messages": m} for m in CONVERSATIONS])
    stats = _run(path, bare)
    want = sum(len(tok.encode("".join(f"{m['role']}: {m['content']}\n" for m in c)).ids) for c in CONVERSATIONS)
    assert stats["total_tokens"] == want
    assert any("fallback" in w for w in stats["warnings"])


def test_broken_template_falls_back_and_says_why(tmp_path, tok_path):
    d = tmp_path / "broken"
    d.mkdir()
    shutil.copy(tok_path, d / "tokenizer.json")
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{% for m in messages %}"}))
    path = _jsonl(tmp_path / "chat.jsonl", [{"messages": CONVERSATIONS[0]}])
    stats = _run(path, d)
    assert any("does not compile" in w for w in stats["warnings"])


def test_template_error_is_a_counted_record_error(tmp_path, tok_path):
    d = tmp_path / "strict"
    d.mkdir()
    shutil.copy(tok_path, d / "tokenizer.json")
    template = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('must start with user') }}{% endif %}x"
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    path = _jsonl(tmp_path / "chat.jsonl", [{"messages": m} for m in CONVERSATIONS])
    stats = _run(path, d)
    assert stats["samples"] == 1 and stats["errors"]["by_kind"] == {"template": 1}
    assert "must start with user" in stats["errors"]["examples"][0] and ":1:" in stats["errors"]["examples"][0]
