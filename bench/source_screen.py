"""Model-free consistency screen of the measured tables (issue 15 evidence).

bench/time_accuracy.py compares the time model with measured rows. Some rows disagree with rows of
their own source table in a way no implementation can produce; this screen finds them without any
trainledger estimate: it compares measured rows with each other under a few physical rules that
hold for every implementation. It is evidence printed beside the accuracy figures, never a filter:
the primary set, its medians and its count of cases > 20% do not depend on it.

Rows are compared only within one *group*: the same source (yaml file and the locator of the
document at its commit), model, GPU part and power limit, GPUs per node, software (runtime,
framework flags, time options), recipe (precision, recompute, attention, dropout, method) and
model-parallel layout other than the swept data- and context-parallel sizes. Rates are tokens/s
per GPU (a step-time row: global batch x sequence / (step time x GPUs)); rows measured in TFLOP/s
or GPU-hours are not screened (no two of them share a group).

Each rule compares a pair of rows. A violation says the pair is inconsistent, not which of the two
rows is off: a row is *flagged* when it belongs to at least one violating pair, and the count of
violating pairs it belongs to is printed beside it.

Tolerance, applied to every rule: TOLERANCE for run-to-run / release-to-release noise, plus half
a unit of the last printed digit of each figure (the tables print rounded numbers: MosaicML and
torchtitan integers, e.g. torchtitan's 405B CP8 row "16" TPS/GPU is +-3% by rounding alone).

The rules (each holds for any implementation; the reasoning is the rule's justification):

(a) Weak scaling. Two runs of one group at the same sequence length, micro-batch and CP size, the
    larger with more data-parallel (FSDP/ZeRO) ranks and no more micro-batches per step per rank,
    run the same kernels on the same per-rank tokens. What changes with the number of ranks: the
    data-parallel collectives (ring all-gather / reduce-scatter / all-reduce move (n-1)/n of the
    same bytes per rank, more hops and, past one node, the slower inter-node link: never faster),
    and the sharded optimizer step and sharded state (1/n of the parameters per rank: smaller).
    The optimizer step of a sharded run is a small share of a step (MPT-1B at 32 A100s: AdamW over
    1.3e9/32 parameters, about 1 GB of memory traffic, ~1 ms of a 1.3 s step), so a larger run is
    not faster per GPU beyond noise. Caveat: the freed sharded state (1/n) can move a run that
    sits at the memory edge off it (fewer allocator retries); the screen cannot see memory, so a
    violation at a memory-edge micro-batch is a pair to inspect, not proof of a bad measurement.
    A dip and recovery (n1 < n2 < n3 with the n2 row slow) shows up as violating pairs (n2, n3).
(b) Shorter sequence at equal work per rank. Two runs of one group on the same GPUs with equal
    tokens per rank per micro-batch (micro-batch x sequence / CP) and per step (global batch x
    sequence / (DP x CP)): every GEMM has the same shape (its M dimension is the token count),
    the norms, activations, embedding, loss, FSDP collectives and optimizer step handle the same
    bytes; only attention differs, whose work per token grows with the sequence (causal: about s/2
    keys per query; with CP, the load-balanced ring gives each rank 1/CP of the s^2/2 score
    blocks). The shorter-sequence row does no more work in every term, so it is not slower.
    (A less efficient attention kernel at the shorter sequence could undo this only if its
    efficiency fell by more than the ratio of the sequences, e.g. 4x from 2048 to 512.)
(c) Attention-bound limit (same pairs as (b), k = longer / shorter sequence). Per rank the step is
    T(s) = G + A(s) + R(s): G the work that (b) shows equal in both rows, A attention (at equal
    tokens per rank proportional to s, so A(k s) = k A(s)), R the CP ring overhead (KV exchange
    not hidden behind attention, merging of partial outputs), (CP - 1) ring steps of fixed size
    at equal tokens per rank. Then T(k s) <= k T(s) + (k - 1) R1 with R1 one ring step's overhead,
    a small share of the step (Llama 3.1 8B, CP 2 -> 4 on one NVLink node: one ring step moves
    32768 tokens x 4096 (K and V after repeat_kv, torchtitan models/llama/model.py @ 9dec370) x 2
    x 2 bytes = 0.54 GB per layer and pass; forward, recomputed forward and backward (KV and
    their gradients) over 32 layers make ~69 GB, ~0.2 s at ~300 GB/s of NVLink even if none of it
    were hidden: under 2% of the 12.9 s step at CP 2, i.e. 32768 tokens / 2540 tok/s; an estimate,
    inside TOLERANCE). So the throughput ratio of the longer row to the shorter is >= 1/k.
    Torch's ring attention is load-balanced by default (torch/distributed/tensor/experimental/
    _attention.py, _ContextParallelOptions.enable_load_balance = True; torchtitan @ 9dec370
    utils.create_context_parallel_ctx does not change it). Without load balancing the limit would
    be (k1 - 1/2) / (k2 - 1/2) for CP k1 -> k2 at equal tokens per rank (the last rank computes
    k - 1/2 blocks), e.g. 0.43 for CP 2 -> 4.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import yaml

#: Noise allowance between two measurements of runs that should be equal or ordered. An estimate:
#: the one repeated publication among the sources, NVIDIA NeMo's 24.07 performance summary
#: (nemo_24_07_perf.yaml notes: commit 070a0bb1 listed GPT3-5B at 22521 tok/s/GPU, commit
#: 0b8a80ee at 23406, the same label) differs by 3.9%; torchtitan reads one TPS sample at the
#: 90th iteration (benchmarks/llama3_h100_202412_torchtitan.md @ b5bcd76) and MosaicML's rows are
#: 12-step runs (mosaicml_llm_foundry_mpt_a100.yaml provenance), neither averaged. 5% rounds 3.9% up.
TOLERANCE = 0.05


RULES = {
    "a": ("weak scaling: same group, sequence, micro-batch and CP size, more GPUs (more data-"
          "parallel / FSDP ranks) with no more micro-batches per step: per-GPU throughput does "
          "not rise"),
    "b": ("shorter sequence at equal work per rank: same group and GPU count, equal tokens per "
          "rank per micro-batch and per step, shorter sequence: per-GPU throughput not lower"),
    "c": ("attention-bound limit: same pairs as (b); the longer sequence (k times) does at most k "
          "times the per-rank work: per-GPU throughput ratio >= 1/k"),
}


@dataclass(frozen=True)
class Row:
    """One measured row, as the screen sees it (no estimate involved)."""

    id: str
    group: tuple            # everything that must match for two rows to be compared
    gpus: int
    dp: int
    cp: int
    seq: int
    mbs: int                # sequences per micro-batch per data-parallel rank
    gbs: int                # sequences per step
    rate: float             # measured tokens/s per GPU
    rel_resolution: float = 0.0   # half a unit of the printed figure, relative to it

    @property
    def microbatches(self) -> float:
        """Micro-batches per step per data-parallel rank."""
        return self.gbs / (self.dp * self.mbs)

    @property
    def rank_tokens_per_microbatch(self) -> float:
        return self.mbs * self.seq / self.cp

    @property
    def rank_tokens_per_step(self) -> float:
        return self.gbs * self.seq / (self.dp * self.cp)

    @property
    def low(self) -> float:
        return self.rate * (1 - self.rel_resolution)

    @property
    def high(self) -> float:
        return self.rate * (1 + self.rel_resolution)


@dataclass
class Violation:
    rule: str
    a: str                  # the reference row (fewer GPUs / shorter sequence)
    b: str                  # the row compared with it
    rate_a: float
    rate_b: float
    ratio: float            # rate_b / rate_a
    bound: float            # the rule's bound on the ratio (before printed-precision slack)
    kind: str               # 'max' (ratio must not exceed bound) or 'min'
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _close(x: float, y: float) -> bool:
    return abs(x - y) <= 1e-9 * max(abs(x), abs(y), 1.0)


def weak_scaling(a: Row, b: Row, tol: float = TOLERANCE) -> Violation | None:
    """Rule (a) on one pair (any order): the row with more GPUs is not faster per GPU."""
    if a.group != b.group or a.gpus == b.gpus:
        return None
    small, big = (a, b) if a.gpus < b.gpus else (b, a)
    if (small.seq, small.mbs, small.cp) != (big.seq, big.mbs, big.cp) or big.dp <= small.dp:
        return None
    if big.microbatches > small.microbatches + 1e-9:
        return None  # the larger run amortises its optimizer step over more micro-batches
    bound = 1 + tol
    if big.low > small.high * bound:
        return Violation("a", small.id, big.id, small.rate, big.rate, big.rate / small.rate, bound,
                         "max", f"{small.gpus} -> {big.gpus} GPUs, micro-batch {big.mbs}, "
                                f"{big.microbatches:g} micro-batch(es)/step")
    return None


def _sequence_pair(a: Row, b: Row) -> tuple[Row, Row] | None:
    """(shorter, longer) when a and b are a rule (b)/(c) pair, else None."""
    if a.group != b.group or a.gpus != b.gpus or a.seq == b.seq:
        return None
    if not (_close(a.rank_tokens_per_microbatch, b.rank_tokens_per_microbatch)
            and _close(a.rank_tokens_per_step, b.rank_tokens_per_step)
            and a.dp * a.cp == b.dp * b.cp):
        return None
    return (a, b) if a.seq < b.seq else (b, a)


def shorter_not_slower(a: Row, b: Row, tol: float = TOLERANCE) -> Violation | None:
    """Rule (b) on one pair (any order): at equal work per rank the shorter sequence is not slower."""
    pair = _sequence_pair(a, b)
    if pair is None:
        return None
    short, long_ = pair
    bound = 1 + tol
    if long_.low > short.high * bound:
        return Violation("b", short.id, long_.id, short.rate, long_.rate, long_.rate / short.rate,
                         bound, "max", _seq_detail(short, long_))
    return None


def attention_bound(a: Row, b: Row, tol: float = TOLERANCE) -> Violation | None:
    """Rule (c) on one pair (any order): longer/shorter throughput >= shorter/longer sequence."""
    pair = _sequence_pair(a, b)
    if pair is None:
        return None
    short, long_ = pair
    bound = short.seq / long_.seq * (1 - tol)
    if long_.high < short.low * bound:
        return Violation("c", short.id, long_.id, short.rate, long_.rate, long_.rate / short.rate,
                         bound, "min", _seq_detail(short, long_))
    return None


def _seq_detail(short: Row, long_: Row) -> str:
    cp = f", CP {short.cp} -> {long_.cp}" if short.cp != long_.cp else ""
    return (f"seq {short.seq} -> {long_.seq} (k = {long_.seq / short.seq:g}){cp}, "
            f"{short.rank_tokens_per_microbatch:g} tokens/rank/micro-batch")


CHECKS = (weak_scaling, shorter_not_slower, attention_bound)


@dataclass
class Screen:
    rows: list[Row]
    violations: list[Violation] = field(default_factory=list)
    pairs: dict[str, int] = field(default_factory=dict)   # rule -> pairs the rule applied to

    def flagged(self) -> dict[str, int]:
        """Row id -> number of violating pairs it belongs to."""
        out: dict[str, int] = {}
        for v in self.violations:
            for i in (v.a, v.b):
                out[i] = out.get(i, 0) + 1
        return out


def screen(rows: Iterable[Row], tol: float = TOLERANCE) -> Screen:
    rows = list(rows)
    s = Screen(rows, pairs={"a": 0, "b": 0, "c": 0})
    for i, a in enumerate(rows):
        for b in rows[i + 1:]:
            if a.group != b.group:
                continue
            if a.gpus != b.gpus and (a.seq, a.mbs, a.cp) == (b.seq, b.mbs, b.cp):
                lo, hi = (a, b) if a.gpus < b.gpus else (b, a)
                if hi.microbatches <= lo.microbatches + 1e-9 and hi.dp > lo.dp:
                    s.pairs["a"] += 1
            if _sequence_pair(a, b):
                s.pairs["b"] += 1
                s.pairs["c"] += 1
            for check in CHECKS:
                v = check(a, b, tol)
                if v:
                    s.violations.append(v)
    return s


# --------------------------------------------------------------------------------------------
# rows of bench/time_accuracy.py's cases


def _half_unit(x: float) -> float:
    """Half a unit of the last digit x is printed with (yaml value as written)."""
    if float(x).is_integer():
        return 0.5
    decimals = len(repr(float(x)).split(".")[1])
    return 0.5 * 10.0 ** -decimals


def provenance(gt: Path) -> dict[str, tuple[str, str, str]]:
    """Case id -> (yaml file, source locator, model name) from the raw tables."""
    out = {}
    for path in sorted(Path(gt).glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        if not isinstance(data, dict) or "cases" not in data:
            continue
        src = data.get("source", {}) or {}
        loc = src.get("locator", "") if isinstance(src, dict) else ""
        for c in data["cases"]:
            out[c["id"]] = (path.name, str(c.get("source") or loc), str(c.get("model", "")))
    return out


def _dump(x: Any) -> tuple:
    d = x.model_dump() if hasattr(x, "model_dump") else dict(x.__dict__)
    return tuple(sorted((k, repr(v)) for k, v in d.items()))


def row_of_case(case: Any, prov: dict[str, tuple[str, str, str]]) -> Row | None:
    """The screen's view of a time_accuracy Case (None where its metric is not a token rate)."""
    p = case.plan
    r, lay, cl = p.recipe, p.layout, p.cluster
    seq, mbs, gbs, gpus = r.seq_len, r.micro_batch, r.global_batch, cl.world_size
    if not gbs or case.id not in prov:
        return None
    if case.metric == "tokens_per_s_per_gpu":
        rate, rel = case.measured, _half_unit(case.measured) / case.measured
    elif case.metric == "step_time_s":
        rate = gbs * seq / (case.measured * gpus)
        rel = _half_unit(case.measured) / case.measured
    else:
        return None
    file, locator, model = prov[case.id]
    recipe = tuple((k, repr(getattr(r, k))) for k in (
        "method", "precision", "optimizer", "recompute", "recompute_layers", "attention", "dropout",
        "lora_rank", "lora_targets"))
    layout = tuple((k, repr(getattr(lay, k))) for k in (
        "tp", "pp", "vp", "ep", "etp", "sp", "pp_schedule", "pp_microbatches", "zero",
        "hybrid_shard", "offload"))
    hardware = (cl.gpu.name, repr(cl.gpu.power_limit_w), cl.gpus_per_node)
    group = (file, locator, model, hardware, recipe, layout, _dump(p.runtime), _dump(case.opts))
    return Row(case.id, group, gpus, lay.dp or gpus // (lay.tp * lay.pp * lay.cp), lay.cp, seq,
               mbs, gbs, float(rate), rel)


def rows_of_cases(cases: Iterable[Any], gt: Path) -> list[Row]:
    prov = provenance(gt)
    return [row for row in (row_of_case(c, prov) for c in cases) if row is not None]


def report(s: Screen, over_20pct: Iterable[str]) -> dict[str, Any]:
    """The screen as data (``--json``'s ``source_screen``)."""
    flagged = s.flagged()
    over = list(over_20pct)
    return {"tolerance": TOLERANCE, "rules": RULES, "rows_screened": len(s.rows),
            "pairs_compared": s.pairs,
            "violations": [v.as_dict() for v in s.violations],
            "flagged": flagged,
            "over_20pct": {"flagged": [i for i in over if i in flagged],
                           "not_flagged": [i for i in over if i not in flagged]}}


def print_report(data: dict[str, Any], errors: dict[str, float]) -> None:
    """The text section printed after time_accuracy's summary (errors: id -> signed error)."""
    print("\nsource-consistency screen (model-free: measured rows against rows of their own table; "
          "evidence beside the figures above, not a filter)")
    for k, v in data["rules"].items():
        print(f"  ({k}) {v}")
    print(f"  tolerance {100 * data['tolerance']:.0f}% (noise) + half a unit of each printed figure;"
          f" rows screened {data['rows_screened']}; pairs compared: "
          + ", ".join(f"({k}) {n}" for k, n in data["pairs_compared"].items()))
    print("  violations (a pair is inconsistent; the rule does not say which of its rows is off):")
    for v in data["violations"]:
        rel = "<=" if v["kind"] == "max" else ">="
        print(f"    ({v['rule']}) {v['a']} {v['rate_a']:g} -> {v['b']} {v['rate_b']:g} tok/s/GPU: "
              f"ratio {v['ratio']:.3f}, rule {rel} {v['bound']:.3f}; {v['detail']}")
    if not data["violations"]:
        print("    none")
    print("  flagged rows (violating pairs; signed error of the time model above):")
    for i, n in sorted(data["flagged"].items(), key=lambda kv: (-kv[1], kv[0])):
        e = errors.get(i)
        err = f"{100 * e:+6.1f}%" if e is not None else "   n/a"
        big = "  (> 20%)" if i in data["over_20pct"]["flagged"] else ""
        print(f"    {i:52s} {n} pair(s)  error {err}{big}")
    o = data["over_20pct"]
    print(f"  cases > 20%: {len(o['flagged']) + len(o['not_flagged'])}, of which flagged by the screen "
          f"{len(o['flagged'])}, not flagged {len(o['not_flagged'])}")
