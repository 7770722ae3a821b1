"""Data loading: the read bandwidth, IOPS and CPU the input pipeline needs, against the cluster's.

Glossary:
    T     tokens/s of the whole cluster (time model)     β   bytes per token on disk
    s     tokens per sample (sequence length)           n   nodes
    k     4 KiB blocks one random sample read touches    W   DataLoader workers per node
    λ     storage read latency at queue depth 1          r   tokenizer bytes/s per CPU core

    read bandwidth per node  = T · β / n
    IOPS per node            = T / s / n · k,   k = ceil(s·β / 4096) + 1   (unaligned random read)
    IOPS W workers reach     = W / λ            (one synchronous read in flight per worker; Little's law)
    tokenizer cores per node = T · β_raw / n / r

Pre-tokenized data stores token ids as uint16 when the vocabulary fits (V ≤ 65,536), else as
4-byte ids, as Megatron-LM's indexed datasets do (``megatron/core/datasets/indexed_dataset.py``,
``DType.optimal_dtype``); raw text is ~4 bytes per token for English BPE vocabularies (OpenAI help
center). A GPU is starved when any demand exceeds what the node delivers.
"""

from __future__ import annotations

import math
from typing import Any

from trainledger.spec.plan import Plan
from trainledger.units import GB
from trainledger.estimate.run.common import Section, run_figures
from trainledger.estimate.options import CostOptions
from trainledger.estimate.run.prices import PriceCatalog, load_prices
from trainledger.estimate.terms import Term

IO_BLOCK_BYTES = 4096  # the block size StorageSpec.random_read_iops is stated for
UINT16_VOCAB_LIMIT = 65_536


def tokenized_bytes_per_token(vocab_size: int) -> int:
    """Bytes per stored token id: 2 (uint16) when V ≤ 65,536, else 4."""
    return 2 if vocab_size <= UINT16_VOCAB_LIMIT else 4


def read_bytes_per_s(tokens_per_s: float, bytes_per_token: float) -> float:
    """Read bandwidth that feeds ``tokens_per_s``: T · β."""
    return tokens_per_s * bytes_per_token


def blocks_per_sample(sample_bytes: float, block: int = IO_BLOCK_BYTES) -> int:
    """4 KiB blocks an unaligned random read of one sample touches: ceil(bytes / block) + 1."""
    return math.ceil(sample_bytes / block) + 1


def required_iops(samples_per_s: float, sample_bytes: float, block: int = IO_BLOCK_BYTES) -> float:
    """Random-read IOPS for ``samples_per_s`` samples of ``sample_bytes`` each."""
    return samples_per_s * blocks_per_sample(sample_bytes, block)


def worker_iops(workers: int, latency_s: float) -> float:
    """IOPS that ``workers`` synchronous readers reach: W / λ (Little's law, one read in flight each)."""
    return workers / latency_s


def tokenizer_cores(text_bytes_per_s: float, bytes_per_s_per_core: float) -> float:
    """CPU cores that tokenize ``text_bytes_per_s`` of raw text."""
    return text_bytes_per_s / bytes_per_s_per_core


def _pick(value: Any, prices: PriceCatalog, key: str, flag: str) -> tuple[float, str]:
    if value is not None:
        return value, f"user ({flag})"
    d = prices.default(key)
    return d.value, d.source


def _resolved(plan: Plan, options: CostOptions, prices: PriceCatalog) -> dict[str, Any]:
    st = plan.cluster.storage
    raw = options.data_format == "raw"
    if options.bytes_per_token is not None:
        beta, b_src = options.bytes_per_token, "user (--bytes-per-token)"
    elif raw:
        beta, b_src = _pick(None, prices, "raw_bytes_per_token", "")
    else:
        beta = tokenized_bytes_per_token(plan.model.vocab_size)
        b_src = f"token ids as uint{8 * beta} for V = {plan.model.vocab_size} (Megatron-LM indexed dataset)"
    workers, w_src = _pick(options.dataloader_workers, prices, "dataloader_workers_per_gpu", "--dataloader-workers")
    tok, t_src = _pick(options.tokenizer_bytes_per_s_per_core, prices, "tokenizer_bytes_per_s_per_core",
                       "--tokenizer-bytes-per-s")
    lat_us, l_src = _pick(None, prices, "storage_latency_us", "")
    return {"bytes_per_token": beta, "bytes_per_token_source": b_src, "data_format": options.data_format,
            "workers_per_gpu": int(workers), "workers_source": w_src,
            "tokenizer_bytes_per_s_per_core": tok, "tokenizer_source": t_src,
            "storage_latency_s": lat_us * 1e-6, "storage_latency_source": l_src,
            "storage_read_bytes_per_s": (options.storage_read_gb_per_s or st.read_gb_per_s) * GB,
            "storage_iops": options.storage_iops or st.random_read_iops,
            "storage": st.name, "cpu_cores_per_node": plan.cluster.cpu_cores}


def io_section(plan: Plan, options: CostOptions, memory: Any = None, compute: Any = None,
               time: Any = None, prices: PriceCatalog | None = None) -> Section:
    """The ``io`` section: read bandwidth, IOPS and tokenizer cores per node vs what the node has."""
    prices = prices or load_prices(options.prices_file)
    c, s = plan.cluster, plan.recipe.seq_len
    x = _resolved(plan, options, prices)
    run = run_figures(plan, compute, time)
    beta = x["bytes_per_token"]
    sample_bytes = s * beta
    v: dict[str, Any] = {"read_bytes_per_s": None, "read_bytes_per_s_per_node": None, "iops_per_node": None,
                         "tokenizer_cores_per_node": 0.0, "bytes_per_step": plan.tokens_per_step * beta,
                         "sample_bytes": sample_bytes, "dataset_bytes": None, "starved": False, "reasons": []}
    if plan.recipe.train_tokens:
        v["dataset_bytes"] = plan.recipe.train_tokens * beta
    inputs = {**x, "tokens_per_s": run.tokens_per_s, "nodes": c.nodes, "seq_len": s,
              "workers_per_node": x["workers_per_gpu"] * c.gpus_per_node}
    terms = [Term("bytes_per_token", beta, "bytes", x["bytes_per_token_source"])]
    if not run.tokens_per_s:
        return Section(v, inputs, terms, ["no step time: the time model gives the tokens/s the data must feed"])
    t_node = run.tokens_per_s / c.nodes
    bw = read_bytes_per_s(t_node, beta)
    iops = required_iops(t_node / s, sample_bytes)
    w_node = x["workers_per_gpu"] * c.gpus_per_node
    # no dataloader workers: each training process reads in its main loop, one request at a time
    w_iops = worker_iops(w_node or c.gpus_per_node, x["storage_latency_s"])
    cores = 0.0
    if x["data_format"] == "raw":
        cores = tokenizer_cores(t_node * beta, x["tokenizer_bytes_per_s_per_core"])
    spare_cores = max(c.cpu_cores - c.gpus_per_node, 0)  # one core per training process
    v.update(read_bytes_per_s=read_bytes_per_s(run.tokens_per_s, beta), read_bytes_per_s_per_node=bw,
             iops_per_node=iops, worker_iops_per_node=w_iops, tokenizer_cores_per_node=cores,
             read_utilization=bw / x["storage_read_bytes_per_s"], iops_utilization=iops / x["storage_iops"],
             spare_cpu_cores_per_node=spare_cores)
    checks = [(bw > x["storage_read_bytes_per_s"], f"storage read {bw / GB:.2f} GB/s per node needed, "
               f"{x['storage_read_bytes_per_s'] / GB:.2f} GB/s available"),
              (iops > x["storage_iops"], f"{iops:,.0f} random-read IOPS per node needed, "
               f"{x['storage_iops']:,.0f} available"),
              (iops > w_iops, f"{w_node} DataLoader workers per node reach {w_iops:,.0f} IOPS at "
               f"{x['storage_latency_s'] * 1e6:.0f} us latency, {iops:,.0f} needed: add workers"),
              (cores > spare_cores, f"on-the-fly tokenization needs {cores:.1f} cores per node, "
               f"{spare_cores} spare"),
              (x["data_format"] == "raw" and w_node and cores > w_node,
               f"tokenization needs {cores:.1f} cores but only {w_node} workers per node run it")]
    v["reasons"] = [msg for bad, msg in checks if bad]
    v["starved"] = bool(v["reasons"])
    terms += [Term("read_bytes_per_s_per_node", bw, "bytes/s", "T·β/n"),
              Term("iops_per_node", iops, "count/s", "T/s/n · (ceil(s·β/4096) + 1)"),
              Term("tokenizer_cores_per_node", cores, "count", x["tokenizer_source"])]
    return Section(v, inputs, terms, [])
