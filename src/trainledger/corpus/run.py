"""analyze(): split the inputs into work units, scan them on all cores, merge the counts."""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable, Iterator

from trainledger.errors import CorpusError
from trainledger.corpus.options import CorpusOptions
from trainledger.corpus.readers import LINE_FORMATS, Unit
from trainledger.corpus.streams import open_binary, pyarrow_modules
from trainledger.corpus.report import build_stats
from trainledger.corpus.sources import Source, discover
from trainledger.corpus.tokenizer import TokenCounter, load_counter
from trainledger.corpus.work import Tally, UnitResult, Worker, init_process, run_unit

Progress = Callable[[int, int], None]

#: records per byte of a compressed file when only the head can be looked at (text compresses
#: about 3-4x with gzip/zstd); used only to size the --sample draw, never in a reported statistic.
_ASSUMED_COMPRESSION = 4.0
_HEAD_BYTES = 1 << 20
_FILES_PER_UNIT = 256


def plan_units(sources: list[Source], opts: CorpusOptions, workers: int) -> list[Unit]:
    """Work units: byte ranges of plain line files, strided passes over the rest."""
    units: list[Unit] = []
    text_files: list[tuple[int, Source]] = [(i, s) for i, s in enumerate(sources) if s.fmt == "txt-file"]
    for i, src in enumerate(sources):
        if src.fmt == "txt-file":
            continue
        if src.fmt in LINE_FORMATS and src.compression is None:
            step = opts.chunk_bytes
            units += [Unit(src, i, "range", start, min(start + step, src.size)) for start in range(0, src.size, step)]
            continue
        k = workers if src.size > opts.chunk_bytes else 1
        units += [Unit(src, i, "stride", start=j, stride=k) for j in range(k)]
    for g in range(0, len(text_files), _FILES_PER_UNIT):
        group = text_files[g:g + _FILES_PER_UNIT]
        units.append(Unit(group[0][1], group[0][0], "files", files=tuple(s for _, s in group)))
    return units


def _estimate_records(src: Source, opts: CorpusOptions) -> float:
    """About how many records a file holds (exact for Parquet/Arrow), to size a --sample draw."""
    if src.fmt == "txt-file":
        return 1.0
    if src.fmt in ("parquet", "arrow-file", "arrow-stream", "feather-v1"):
        pa, pq = pyarrow_modules()
        try:
            if src.fmt == "parquet":
                return float(pq.ParquetFile(src.path).metadata.num_rows)
            if src.fmt == "arrow-stream":
                return float(sum(b.num_rows for b in pa.ipc.open_stream(pa.memory_map(src.path, "r"))))
            return float(pa.ipc.open_file(pa.memory_map(src.path, "r")).read_all().num_rows)
        except (pa.ArrowInvalid, OSError):
            return 0.0
    try:
        with open_binary(src, opts) as f:
            head = f.read(_HEAD_BYTES)
    except Exception:  # noqa: BLE001 - a broken file is reported by the scan itself
        return 1.0
    lines = max(head.count(b"\n"), 1)
    if len(head) < _HEAD_BYTES:  # the whole file
        return float(lines)
    size = src.size * (_ASSUMED_COMPRESSION if src.compression else 1.0)
    return size * lines / len(head)


def sample_rate(sources: list[Source], opts: CorpusOptions) -> float | None:
    """The share of records to tokenize for about ``opts.sample`` samples; None = all."""
    if not opts.sample:
        return None
    estimated = sum(_estimate_records(s, opts) for s in sources)
    return None if estimated <= opts.sample else opts.sample / estimated


def _pool_context() -> multiprocessing.context.BaseContext:
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
    if "forkserver" in methods:
        ctx.set_forkserver_preload(["trainledger.corpus.work"])
    return ctx


def execute(units: list[Unit], counter: TokenCounter, opts: CorpusOptions, rate: float | None,
            workers: int) -> Iterator[UnitResult]:
    """Unit results in unit order (line numbers need the order), on ``workers`` processes."""
    jobs = list(enumerate(units))
    if workers <= 1 or len(units) <= 1:
        worker = Worker(counter, opts, rate)
        yield from (worker.run(i, u) for i, u in jobs)
        return
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    # not multiprocessing.Pool: its imap waits forever for the unit of a worker the OS killed (OOM)
    pool = ProcessPoolExecutor(min(workers, len(units)), mp_context=_pool_context(), initializer=init_process,
                               initargs=(counter.state(), opts.model_dump_json(), rate))
    try:
        yield from pool.map(run_unit, jobs)
    except BrokenProcessPool:
        raise CorpusError("a worker process died (killed by the operating system, e.g. out of memory); "
                          "rerun with fewer --workers or a smaller --max-line-bytes") from None
    finally:
        procs = list((getattr(pool, "_processes", None) or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in procs:  # stop units still running when the caller stopped early
            proc.terminate()


def analyze(paths: list[str], opts: CorpusOptions | None = None, progress: Progress | None = None) -> dict:
    """Token-length statistics, padding waste and recommendations for a dataset (the stats JSON)."""
    opts = opts or CorpusOptions()
    t0 = time.perf_counter()
    sources = discover(list(paths), opts.text_mode, opts.split)
    counter = load_counter(opts.tokenizer, opts.chars_per_token, opts.chat_template)
    workers = opts.workers or os.cpu_count() or 1
    rate = sample_rate(sources, opts)
    units = plan_units(sources, opts, workers)
    workers = 1 if workers <= 1 or len(units) <= 1 else min(workers, len(units))
    total_weight, done = sum(u.weight for u in units) or 1, 0
    tally = Tally()
    for res in execute(units, counter, opts, rate, workers):
        tally.add(res, units[res.unit_index], opts.on_error)
        done += res.weight
        if progress:
            progress(done, total_weight)
    elapsed = time.perf_counter() - t0
    return build_stats(paths, sources, counter, opts, tally, rate, workers, elapsed)
