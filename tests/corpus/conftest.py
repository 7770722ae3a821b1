"""Shared fixtures of the corpus tests: generated texts and tokenizers trained here, in the test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("tokenizers")

from corpus_fixtures import CHAT_TEMPLATE, make_texts, train_tokenizer  # noqa: E402


@pytest.fixture(scope="session")
def texts() -> list[str]:
    return make_texts(400)


@pytest.fixture(scope="session")
def tok_dir(tmp_path_factory, texts) -> Path:
    """A folder with tokenizer.json (BPE, adds <s> ... </s>) and a tokenizer_config.json chat template."""
    d = tmp_path_factory.mktemp("tok")
    train_tokenizer(texts).save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": {"content": "</s>"}, "chat_template": CHAT_TEMPLATE}))
    return d


@pytest.fixture(scope="session")
def tok_path(tok_dir) -> Path:
    return tok_dir / "tokenizer.json"


@pytest.fixture(scope="session")
def tok(tok_path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tok_path))


@pytest.fixture(scope="session")
def ref_lengths(tok, texts) -> list[int]:
    """Token count of each text, straight from the tokenizer, one call per text."""
    return [len(tok.encode(t).ids) for t in texts]
