"""CorpusOptions: everything that steers one corpus analysis (the ``trainledger corpus`` flags)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from trainledger.spec.base import Spec
from trainledger.units import GIB, MIB

#: Rule of thumb for English text with GPT-style BPE tokenizers: "one token generally corresponds to
#: ~4 characters of text". OpenAI Help Center, "What are tokens and how to count them?",
#: https://help.openai.com/en/articles/4936856-what-are-tokens-and-how-to-count-them
DEFAULT_CHARS_PER_TOKEN = 4.0

OnError = Literal["skip", "fail"]
TextMode = Literal["line", "file"]
EncodingErrors = Literal["strict", "replace"]


class CorpusOptions(Spec):
    """How to read, tokenize and summarize a dataset."""

    fields: tuple[str, ...] = Field((), description="record fields holding the text (dotted paths ok); "
                                    "empty = detect: messages/conversations, prompt+response, text ...")
    tokenizer: str | None = Field(None, description="tokenizer.json path, its folder, or a cached Hub id")
    chars_per_token: float = Field(DEFAULT_CHARS_PER_TOKEN, gt=0, le=100,
                                   description="approximation used only without a tokenizer")
    add_special_tokens: bool = Field(True, description="count BOS/EOS the tokenizer adds")
    chat_template: bool = Field(True, description="render chat records with the tokenizer's template")
    seq_len: int | None = Field(None, gt=0, le=10_000_000, description="sequence length s (tokens); "
                                "None = the recommended one")
    micro_batch: int = Field(8, gt=0, le=65536, description="samples per micro-batch b for padding")
    workers: int | None = Field(None, ge=1, le=1024, description="processes; None = all cores")
    sample: int | None = Field(None, gt=0, description="tokenize about this many random records only")
    seed: int = Field(0, description="seed of the --sample draw")
    on_error: OnError = Field("skip", description="skip (count) or fail on a malformed record")
    encoding_errors: EncodingErrors = Field("strict", description="strict: non-UTF-8 record is an "
                                            "error; replace: decode with U+FFFD and count it")
    text_mode: TextMode = Field("line", description=".txt files: one sample per line or per file")
    split: str | None = Field(None, description="split of a saved/cached datasets DatasetDict")
    max_line_bytes: int = Field(32 * MIB, gt=0, description="longer lines are skipped and counted")
    max_document_bytes: int = Field(1 * GIB, gt=0, description="cap for one whole-document JSON/CSV/txt")
    max_decompression_ratio: float = Field(200.0, gt=1, description="decompressed/compressed bytes "
                                           "above this ratio abort the file (zip-bomb guard)")
    chunk_bytes: int = Field(8 * MIB, ge=4096, description="work unit size for line-oriented files")
    confidence: float = Field(0.95, gt=0.5, lt=1.0, description="level of --sample intervals")
