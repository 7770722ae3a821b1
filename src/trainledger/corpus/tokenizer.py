"""Count tokens: the user's ``tokenizer.json`` (the ``tokenizers`` library) or a labelled estimate.

A tokenizer is named by a ``tokenizer.json`` path, the folder holding it, or a Hub id found in the
local Hugging Face cache (``HF_HUB_CACHE``, else ``HF_HOME/hub``, else ``~/.cache/huggingface/hub``).
Nothing is downloaded. Without a tokenizer the count is ``ceil(characters / chars_per_token)``,
marked approximate everywhere it is shown.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainledger.errors import CorpusError, MissingDependency
from trainledger.corpus.chat import ChatRenderer, find_template, read_bounded

#: largest tokenizer.json read (bytes). Real ones are far smaller: Gemma 3's 262k-entry vocabulary
#: is about 33 MB (google/gemma-3-1b-it tokenizer.json); a 2 GB file took 4.1 GB to load (issue 20).
MAX_TOKENIZER_BYTES = 128 << 20


def hub_cache() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return Path(home) / "hub"


def _cached_snapshot(ref: str) -> Path | None:
    repo = hub_cache() / ("models--" + ref.replace("/", "--"))
    snaps = repo / "snapshots"
    if not snaps.is_dir():
        return None
    main = repo / "refs" / "main"
    if main.is_file():
        cand = snaps / main.read_text(encoding="utf-8").strip()
        if (cand / "tokenizer.json").is_file():
            return cand
    for cand in sorted(snaps.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True):
        if (cand / "tokenizer.json").is_file():
            return cand
    return None


def locate_tokenizer(ref: str) -> Path:
    """The tokenizer.json a user names by file, folder or cached Hub id."""
    p = Path(ref)
    if p.is_file():
        return p
    if p.is_dir():
        if (p / "tokenizer.json").is_file():
            return p / "tokenizer.json"
        hint = " (it has tokenizer.model: only fast tokenizers are supported — save one with " \
               "AutoTokenizer.from_pretrained(...).save_pretrained(dir))" if (p / "tokenizer.model").exists() else ""
        raise CorpusError(f"{ref}: folder has no tokenizer.json{hint}")
    snap = _cached_snapshot(ref) if "/" in ref and not ref.startswith((".", "/")) else None
    if snap is None:
        raise CorpusError(f"tokenizer {ref!r}: no such file or folder, and not in the local Hub cache "
                          f"({hub_cache()}); give a tokenizer.json path, or fetch it once with "
                          f"`huggingface-cli download {ref} tokenizer.json tokenizer_config.json`")
    return snap / "tokenizer.json"


@dataclass
class TokenCounter:
    """Counts tokens per text. Picklable through ``state()`` for worker processes."""

    name: str
    approximate: bool
    chars_per_token: float | None = None
    tokenizer_json: str | None = None
    template: tuple[str | None, dict, str | None] = (None, {}, None)
    _tok: Any = field(default=None, repr=False)
    _chat: ChatRenderer | None = field(default=None, repr=False)

    @property
    def chat(self) -> ChatRenderer:
        if self._chat is None:
            self._chat = ChatRenderer(*self.template)
        return self._chat

    def state(self) -> dict:
        return {"name": self.name, "approximate": self.approximate, "chars_per_token": self.chars_per_token,
                "tokenizer_json": self.tokenizer_json, "template": self.template}

    @classmethod
    def from_state(cls, state: dict) -> "TokenCounter":
        return cls(**state)

    def _tokenizer(self) -> Any:
        if self._tok is None:
            Tokenizer = import_tokenizers()
            tok = Tokenizer.from_str(self.tokenizer_json)
            tok.no_truncation()
            tok.no_padding()
            self._tok = tok
        return self._tok

    def count(self, texts: list[str], add_special_tokens: bool) -> list[int]:
        """Token count of each text."""
        if self.approximate:
            cpt = self.chars_per_token
            return [math.ceil(len(t) / cpt) for t in texts]
        if not texts:
            return []
        encs = self._tokenizer().encode_batch_fast(texts, add_special_tokens=add_special_tokens)
        return [len(e) for e in encs]

    def describe(self) -> dict:
        return {"name": self.name, "approximate": self.approximate, "chars_per_token": self.chars_per_token,
                "method": (f"estimate: 1 token per {self.chars_per_token:g} characters (Unicode code points)"
                           if self.approximate else "tokenizers library, tokenizer.json")}


def import_tokenizers() -> Any:
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise MissingDependency("counting tokens needs the tokenizers library: "
                                "pip install 'trainledger[corpus]'") from None
    return Tokenizer


def load_counter(ref: str | None, chars_per_token: float, use_template: bool = True) -> TokenCounter:
    """The user's tokenizer, or the labelled characters-per-token estimate when ``ref`` is None."""
    if ref is None:
        return TokenCounter(name=f"approximate ({chars_per_token:g} chars/token)", approximate=True,
                            chars_per_token=chars_per_token)
    path = locate_tokenizer(ref)
    text = read_bounded(path, MAX_TOKENIZER_BYTES, "tokenizer.json")
    Tokenizer = import_tokenizers()
    try:
        Tokenizer.from_str(text)
    except Exception as exc:  # noqa: BLE001 - the library raises its own exception type
        raise CorpusError(f"{path}: not a tokenizers tokenizer.json ({exc})") from None
    template = find_template(path.parent) if use_template else (None, {}, None)
    return TokenCounter(name=ref, approximate=False, tokenizer_json=text, template=template)
