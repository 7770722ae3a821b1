"""Which part of a record is the text: named fields, chat messages, prompt/response pairs.

Without ``--field``, each record's keys are matched in this order (first hit wins):

1. chat: ``messages``, ``conversations``, ``conversation``, ``chat``, ``dialog`` — a list of
   ``{"role", "content"}`` messages (ShareGPT's ``{"from", "value"}`` is mapped: human -> user,
   gpt -> assistant);
2. prompt/response: one of ``prompt, instruction, question, query`` with one of ``response,
   completion, output, answer, chosen`` (Alpaca's ``input`` is appended to the instruction);
3. text: ``text, content, document, body, passage, sentence``;
4. the only string-valued field, when there is exactly one.

A prompt/response pair becomes two messages (user, assistant), so it goes through the chat
template like any conversation. With several ``--field`` names their string values are joined
with a newline.
"""

from __future__ import annotations

from typing import Any

from trainledger.corpus.streams import RecordError

CHAT_KEYS = ("messages", "conversations", "conversation", "chat", "dialog")
PROMPT_KEYS = ("prompt", "instruction", "question", "query")
RESPONSE_KEYS = ("response", "completion", "output", "answer", "chosen")
TEXT_KEYS = ("text", "content", "document", "body", "passage", "sentence")
_ROLE_ALIASES = {"human": "user", "gpt": "assistant", "bot": "assistant", "model": "assistant"}

#: a record's text: plain str, or a list of {"role", "content"} messages
Text = str | list


def _get(rec: dict, path: str) -> Any:
    cur: Any = rec
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            raise KeyError(path)
        cur = cur[part]
    return cur


def _content(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # multimodal parts: keep the text ones
        return "".join(p.get("text", "") for p in value if isinstance(p, dict) and isinstance(p.get("text"), str))
    return "" if value is None else str(value)


def normalize_messages(value: Any) -> list[dict] | None:
    """A list of {"role", "content"} messages, or None when ``value`` is not a conversation."""
    if not isinstance(value, list) or not value or not all(isinstance(m, dict) for m in value):
        return None
    out = []
    for m in value:
        role = m.get("role", m.get("from"))
        if role is None:
            return None
        content = m.get("content", m.get("value", m.get("text")))
        out.append({"role": _ROLE_ALIASES.get(str(role), str(role)), "content": _content(content)})
    return out


def _as_text(value: Any, name: str) -> Text | RecordError:
    if isinstance(value, str):
        return value
    msgs = normalize_messages(value)
    if msgs is not None:
        return msgs
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "\n".join(value)
    kind = "null" if value is None else type(value).__name__
    return RecordError("not_text", f"field {name!r} holds {kind}, not text or chat messages")


def _pair(rec: dict, prompt_key: str, response_key: str) -> list[dict]:
    prompt = _content(rec[prompt_key])
    extra = rec.get("input") if prompt_key == "instruction" else None
    if isinstance(extra, str) and extra:
        prompt = f"{prompt}\n\n{extra}"
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": _content(rec[response_key])}]


def _fields_list(rec: dict) -> str:
    return ", ".join(map(str, list(rec)[:20])) + (" ..." if len(rec) > 20 else "") if rec else "(none)"


class TextExtractor:
    """Turns records into text using the named fields, or by detection (module docstring)."""

    def __init__(self, fields: tuple[str, ...] = ()) -> None:
        self.fields = tuple(f for f in fields if f)

    def columns(self, names: list[str]) -> list[str] | None:
        """Top-level columns a columnar file must load (None = all, when detecting)."""
        if not self.fields:
            return None
        return sorted({f.split(".")[0] for f in self.fields})

    def extract(self, rec: Any) -> Text | RecordError:
        if isinstance(rec, str):
            return rec
        if isinstance(rec, list):
            msgs = normalize_messages(rec)
            return msgs if msgs is not None else RecordError("not_text", "a list that is not chat messages")
        if not isinstance(rec, dict):
            return RecordError("not_text", f"expected an object with a text field, got {type(rec).__name__}")
        return self._named(rec) if self.fields else self._detect(rec)

    def _named(self, rec: dict) -> Text | RecordError:
        parts = []
        for name in self.fields:
            try:
                value = _get(rec, name)
            except KeyError:
                return RecordError("missing_field", f"no field {name!r}; fields: {_fields_list(rec)}")
            parts.append(_as_text(value, name))
        if len(parts) == 1:
            return parts[0]
        for p in parts:
            if isinstance(p, RecordError):
                return p
            if isinstance(p, list):
                return RecordError("not_text", "a chat field cannot be joined with other fields; name it alone")
        return "\n".join(parts)

    def _detect(self, rec: dict) -> Text | RecordError:
        for key in CHAT_KEYS:
            if key in rec:
                return _as_text(rec[key], key)
        prompt = next((k for k in PROMPT_KEYS if isinstance(rec.get(k), str)), None)
        response = next((k for k in RESPONSE_KEYS if k in rec and rec[k] is not None), None)
        if prompt and response:
            return _pair(rec, prompt, response)
        for key in TEXT_KEYS:
            if key in rec:
                return _as_text(rec[key], key)
        strings = [k for k, v in rec.items() if isinstance(v, str)]
        if len(strings) == 1:
            return rec[strings[0]]
        return RecordError("missing_field", f"no text field found; fields: {_fields_list(rec)}; "
                           "name one with --field")
