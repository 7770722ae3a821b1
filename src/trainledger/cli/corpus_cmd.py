"""`trainledger corpus`: token-length statistics of a dataset and the padding waste of batching."""

from __future__ import annotations

from typing import Any

import click
from pydantic import ValidationError

from trainledger.spec.base import spec_error
from trainledger.units import parse_bytes
from trainledger.cli.output import echo_json


def register(main: click.Group) -> None:
    main.add_command(corpus_cmd)


def _size(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    if value is None:
        return None
    try:
        return parse_bytes(value)
    except Exception as exc:  # noqa: BLE001 - shown as a usage error
        raise click.BadParameter(str(exc)) from None


@click.command("corpus")
@click.argument("paths", nargs=-1, required=True)
@click.option("--tokenizer", "-t", help="tokenizer.json, its folder, or a cached Hub id [none: ~4 chars/token ESTIMATE]")
@click.option("--field", "-f", "fields", multiple=True,
              help="record field(s) with the text, dotted paths ok [detect: messages, prompt+response, text]")
@click.option("--seq-len", type=click.IntRange(1), help="sequence length for truncation and padding [recommended]")
@click.option("--micro-batch", type=click.IntRange(1), default=8, show_default=True, help="samples per micro-batch")
@click.option("--workers", "-j", type=click.IntRange(1), help="processes [all cores]")
@click.option("--sample", type=click.IntRange(1), help="tokenize about N random records; adds confidence intervals")
@click.option("--seed", type=int, default=0, show_default=True, help="seed of the --sample draw")
@click.option("--on-error", type=click.Choice(["skip", "fail"]), default="skip", show_default=True,
              help="a malformed record is counted and skipped, or stops the run")
@click.option("--encoding-errors", type=click.Choice(["strict", "replace"]), default="strict", show_default=True,
              help="non-UTF-8 records: an error, or decoded with U+FFFD")
@click.option("--text-mode", type=click.Choice(["line", "file"]), default="line", show_default=True,
              help=".txt files: one sample per line or per file")
@click.option("--split", help="split of a saved/cached datasets DatasetDict [train]")
@click.option("--chars-per-token", type=float, default=4.0, show_default=True,
              help="the estimate used without --tokenizer")
@click.option("--no-chat-template", is_flag=True, help="render chat records with the plain fallback format")
@click.option("--no-special-tokens", is_flag=True, help="do not count BOS/EOS added by the tokenizer")
@click.option("--max-line-bytes", callback=_size, help="longer records are skipped and counted [32MiB]")
@click.option("--json", "as_json", is_flag=True, help="print the stats document (feeds `estimate --corpus`)")
@click.option("--quiet", "-q", is_flag=True, help="no progress bar")
def corpus_cmd(paths: tuple[str, ...], as_json: bool, quiet: bool, **kw: Any) -> None:
    """Token lengths of a dataset: percentiles, histogram, truncation, padding waste, recommendations.

    PATH is a file (JSONL, JSON, Parquet, Arrow/Feather, CSV/TSV, txt; .gz/.zst), a folder, a glob,
    a `datasets` save_to_disk folder, or a Hub dataset id in the local cache.
    """
    from trainledger.corpus import CorpusOptions, analyze
    from trainledger.corpus.progress import ProgressBar
    from trainledger.corpus.render import render_text

    fields = tuple(f.strip() for group in kw.pop("fields") for f in group.split(",") if f.strip())
    chat = not kw.pop("no_chat_template")
    special = not kw.pop("no_special_tokens")
    given = {k: v for k, v in kw.items() if v is not None}
    try:
        opts = CorpusOptions(fields=fields, chat_template=chat, add_special_tokens=special, **given)
    except ValidationError as exc:
        raise spec_error(exc, "corpus") from None
    bar = ProgressBar("corpus", enabled=None if not quiet else False)
    try:
        stats = analyze(list(paths), opts, progress=bar)
    finally:
        bar.close()
    for line in stats["warnings"]:
        click.echo(f"warning: {line}", err=True)
    if as_json:
        echo_json(stats)
    else:
        click.echo(render_text(stats))
