"""Render chat messages to the text the model is trained on.

With a tokenizer folder holding a chat template (``chat_template`` in ``tokenizer_config.json``,
or a ``chat_template.jinja`` file) and jinja2 installed, messages are rendered by that template
the way Hugging Face tokenizers do it: a sandboxed jinja2 environment with ``trim_blocks`` and
``lstrip_blocks``, the variables ``messages``, ``bos_token``, ``eos_token``,
``add_generation_prompt=False`` and a ``raise_exception`` helper. The rendered text already holds
the special tokens, so it is tokenized without adding them again.

Without a template (or without jinja2) the documented fallback is used and reported as such:
``FALLBACK_FORMAT`` per message, concatenated, tokenized with the tokenizer's special tokens.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from trainledger.errors import CorpusError

FALLBACK_FORMAT = "{role}: {content}\n"
#: largest tokenizer_config.json read (bytes): with a 150k-entry ``added_tokens_decoder`` real ones
#: stay under a few MB; one holding a 3e9-character template took more than 5 GB (issue 20)
MAX_CONFIG_BYTES = 64 << 20
#: longest chat template accepted (characters); real ones are 1-20 KB
MAX_TEMPLATE_CHARS = 1 << 20


def read_bounded(path: Path, limit: int, what: str) -> str:
    """A regular file's text of at most ``limit`` bytes, else one CorpusError (no FIFO hang)."""
    from trainledger.errors import SpecError
    from trainledger.safety import read_text

    try:
        return read_text(path, limit, what=what)
    except SpecError as exc:
        raise CorpusError(str(exc)) from None


def _token_text(value: Any) -> str:
    if isinstance(value, dict):
        return str(value.get("content", ""))
    return "" if value is None else str(value)


def find_template(folder: Path) -> tuple[str | None, dict[str, str], str | None]:
    """(template, special tokens, where it came from) from a tokenizer folder."""
    cfg_path = folder / "tokenizer_config.json"
    cfg: dict[str, Any] = {}
    if cfg_path.is_file():
        try:
            cfg = json.loads(read_bounded(cfg_path, MAX_CONFIG_BYTES, "tokenizer_config.json"))
        except (ValueError, RecursionError) as exc:
            raise CorpusError(f"{cfg_path}: not valid JSON ({str(exc)[:200]})") from None
        if not isinstance(cfg, dict):
            raise CorpusError(f"{cfg_path}: not a tokenizer_config.json (expected a JSON object)")
    tokens = {k: _token_text(cfg.get(k)) for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
    template = cfg.get("chat_template")
    where = str(cfg_path) if template else None
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    jinja_file = folder / "chat_template.jinja"
    if not template and jinja_file.is_file():
        template, where = read_bounded(jinja_file, MAX_TEMPLATE_CHARS, "chat template"), str(jinja_file)
    if isinstance(template, str) and len(template) > MAX_TEMPLATE_CHARS:
        raise CorpusError(f"{where}: a chat template of {len(template):,} characters (limit "
                          f"{MAX_TEMPLATE_CHARS:,}); real templates are a few KB")
    return (template if isinstance(template, str) and template else None), tokens, where


class ChatRenderer:
    """messages -> (text, add_special_tokens) with the tokenizer's template or the fallback."""

    def __init__(self, template: str | None, tokens: dict[str, str], where: str | None) -> None:
        self.template_text, self.tokens, self.where = template, tokens, where
        self._compiled: Any = None
        self.reason = "no chat template beside the tokenizer"
        if template:
            try:
                self._compiled = _compile(template)
                self.reason = f"template from {where}"
            except ImportError:
                self.reason = "jinja2 is not installed (pip install jinja2)"
            except Exception as exc:  # noqa: BLE001 - a broken template falls back, reported
                self.reason = f"the chat template in {where} does not compile ({exc})"

    @property
    def uses_template(self) -> bool:
        return self._compiled is not None

    def describe(self) -> str:
        if self.uses_template:
            return self.reason
        return f"fallback {FALLBACK_FORMAT!r} per message ({self.reason})"

    def render(self, messages: list[dict]) -> tuple[str, bool]:
        if self._compiled is None:
            return "".join(FALLBACK_FORMAT.format(**m) for m in messages), True
        text = self._compiled.render(messages=messages, add_generation_prompt=False, **self.tokens)
        return text, False


def _raise(message: str) -> None:
    raise ValueError(message)


def _compile(template: str) -> Any:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(x, ensure_ascii=False, indent=indent)
    return env.from_string(template)
