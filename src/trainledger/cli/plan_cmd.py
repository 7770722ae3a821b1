"""`trainledger plan`: find the hardware and layouts that fit a job, ranked (the main job).

Thin: flags -> Job -> search() -> render. With no arguments it plans the built-in example job;
flags change that job field by field.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from trainledger.spec.runtime import DEEPEP_STACKS, FRAMEWORKS
from trainledger.units import fmt_params, fmt_seconds
from trainledger.cli.cost_opts import cost_options, cost_options_from_kwargs
from trainledger.cli.output import echo_json, table
from trainledger.report.document import alternative_text, limits_phrases

_RANKS = ("time", "cost", "gpus")


def _job(kw: dict[str, Any]):
    """The job to plan: the built-in example job with the given flags applied on top of it.

    A flag changes that field of the job and keeps the rest (``plan --top 3`` plans the example
    job and shows three plans). Returns the job and the names of the fields the flags changed.
    """
    from trainledger.planner.search import EXAMPLE_JOB, Job

    given = {k: v for k, v in kw.items() if v is not None and v != ()}
    corpus, epochs = given.pop("corpus", None), given.pop("epochs", None)
    derived: set[str] = set()
    if corpus:
        from trainledger.corpus.recommend import plan_hints

        hints = plan_hints(corpus)  # padded tokens per epoch and the sequence length they assume
        derived = {k for k in ("seq_len", "tokens") if k not in given}  # from --corpus, not typed
        given.setdefault("seq_len", hints["seq_len"])
        given.setdefault("tokens", float(hints["tokens"]) * (epochs or 1.0))
    time_flags = {k: given.pop(k) for k in ("tp_comm_overlap", "ep_comm_overlap", "runtime") if k in given}
    data = EXAMPLE_JOB.model_dump()
    data.update(given)
    if time_flags:
        from trainledger.estimate.options import TimeOptions

        data["time_options"] = TimeOptions(**{**EXAMPLE_JOB.time_options.model_dump(), **time_flags})
    from pydantic import ValidationError

    from trainledger.spec.base import spec_error

    if data.get("method") == "inference":
        from trainledger.errors import SpecError

        raise SpecError("plan ranks training layouts; to size a serving deployment (GPU type, TP, replicas for a "
                        "load and latency targets) use `trainledger serve-plan --model ...`", field="method")
    try:
        typed = ({*given, *time_flags} - derived) | ({"corpus"} if corpus else set()) | ({"epochs"} if epochs else set())
        return Job.model_validate(data), sorted(typed)
    except ValidationError as exc:
        from trainledger.cli.options import with_flags

        flags = {k: _FLAG_OF.get(k, "--" + k.replace("_", "-")) for k in given}
        raise with_flags(spec_error(exc, "plan"), "plan", flags) from None


def _layout_text(lay: dict[str, Any]) -> str:
    parts = [f"dp{lay['dp']}"]
    for k in ("tp", "pp", "cp", "ep"):
        if lay[k] > 1:
            parts.append(f"{k}{lay[k]}")
    if lay["vp"] > 1:
        parts.append(f"v{lay['vp']}")
    s = "·".join(parts) + f" z{lay['zero']} mb{lay['micro_batch']}×{lay['grad_accum']}"
    if lay.get("framework") and lay["framework"] != "hf":
        s = f"{lay['framework']} " + s
    if lay["recompute"] != "none":
        s += f" rc-{lay['recompute']}"
    if lay["offload"] != "none":
        s += f" off-{lay['offload']}"
    return s


def _plans_table(plans: list[dict[str, Any]], ranked: bool = True) -> str:
    rows = []
    for i, p in enumerate(plans, 1):
        i = i if ranked else "-"  # type: ignore[assignment]
        e = p["estimate"]
        cost = f"${e['cost_usd']:,.0f}" if e.get("cost_usd") is not None else "-"
        days = fmt_seconds(e["total_s"]) if "total_s" in e else "-"
        if e.get("days_interval"):
            lo, hi = e["days_interval"]
            days += f" ({fmt_seconds(lo * 86400)}-{fmt_seconds(hi * 86400)})"
        gpuh = "-" if "gpu_hours" not in e else (
            f"{e['gpu_hours']:,.0f}" if e["gpu_hours"] >= 10 else f"{e['gpu_hours']:.2g}")
        rows.append([f"{i}{'*' if p['pareto'] and ranked else ''}", p["gpu"], p["gpus"], _layout_text(p["layout"]),
                     f"{e['memory_gib']:.1f}/{e['usable_gib']:.0f}", f"{e['step_time_s']:.2f}",
                     f"{e['tokens_per_s_per_gpu']:,.0f}", f"{100 * e['mfu']:.0f}%", days, gpuh, cost])
    return table(rows, ["#", "gpu", "gpus", "layout", "GiB used/usable", "step s", "tok/s/GPU", "MFU",
                        "time", "GPU-h", "cost"], align="llrllrrrrrr")


def _render(res: dict[str, Any], changed: list[str]) -> None:
    job = res["job"]
    head = "built-in example job" if not changed else (
        "job (the built-in example with " + ", ".join(_FLAG_OF.get(k, "--" + k.replace("_", "-")) for k in changed) + ")")
    tokens = f"{fmt_params(job['tokens'])} tokens" if job.get("tokens") else "no token budget"
    deadline = f", deadline {job['deadline_days']:g} days" if job.get("deadline_days") else ""
    if deadline and job.get("deadline_quantile", "estimate") != "estimate":
        deadline += f" at the time interval's {job['deadline_quantile']}"
    docs = f" (packed docs of {job['doc_len']})" if job.get("doc_len") else ""
    stack = job["framework"] + (" + Liger Kernel" if job.get("liger_kernel") else "") + (
        {"deepep": " + DeepEP", "hybridep": " + Hybrid-EP"}.get(str(job.get("moe_dispatcher")), "")
        if any(f in DEEPEP_STACKS for f in (job.get("frameworks") or [job["framework"]])) else "")
    click.echo(f"{head}: {job['model']} {job['method']} ({job['precision']}, {stack}), seq {job['seq_len']}"
               f"{docs}, {tokens}{deadline}, up to {job['max_gpus']} GPUs; ranked by {job['rank_by']}")
    to = job["time_options"]
    over = lambda v, yes, no: "the stack's" if v is None else (yes if v else no)  # noqa: E731
    click.echo(f"time model: stacks {', '.join(job.get('frameworks') or [job['framework']])} "
               f"(catalog/efficiency/stacks); kernels {over(to['runtime'], to['runtime'], '')}, TP comm "
               f"{over(to['tp_comm_overlap'], 'overlapped', 'exposed')}, MoE all-to-all "
               f"{'overlapped' if to['ep_comm_overlap'] else 'exposed'} "
               "(--framework, --search-framework, --runtime, --tp-comm-overlap, --ep-comm-overlap)")
    limits = limits_phrases(res.get("stack_limits") or {})
    if limits:
        click.echo(f"layouts: {'; '.join(limits)} (not searched; --framework or --search-framework "
                   "for a stack that runs them)")
    click.echo(f"searched {res['evaluated']:,} layouts in {fmt_seconds(res['elapsed_s'])} "
               f"({res['plans_per_s']:,.0f}/s); {len(res['rejected'])} candidates rejected\n")
    if res["plans"]:
        click.echo(_plans_table(res["plans"]))
        click.echo("  * = on the Pareto front of (GPUs, time, cost)")
        for i, p in enumerate(res["plans"], 1):
            for r in p["risks"]:
                click.echo(f"  risk #{i}: {r}")
    elif not res.get("unpriced"):
        click.echo("no plan fits within the GPU budget and deadline; see the rejected candidates below")
        if limits:  # the stack's missing parallelisms may be what keeps the job from spreading further
            click.echo(f"  {'; '.join(limits)}: under a stack that runs them")
            for alt in res.get("alternatives", []):
                click.echo(f"    {alt['framework']}: {alternative_text(alt, _layout_text)}")
        for b in res["gpu_count"]:
            if b.get("deadline_beyond_budget_gpus"):
                n = b["deadline_beyond_budget_gpus"]
                click.echo(f"  the deadline needs {n:,} {b['gpu']}, past the budget: --max-gpus {n} shows the plan")
    if res.get("unpriced"):
        click.echo(f"\nnot ranked: no price for {', '.join(res['unpriced_gpus'])} (give --price-per-gpu-hour, "
                   "--provider or a --prices FILE; `trainledger prices`); plans that fit, by GPU count:")
        click.echo(_plans_table(res["unpriced"], ranked=False))
    stacks = len({b.get("framework") for b in res["gpu_count"]}) > 1  # one row per GPU and stack
    rows = [[b["gpu"], b["network"]] + ([b.get("framework") or job["framework"]] if stacks else [])
            + [b["memory_bound_gpus"] or "-",
               b["deadline_bound_gpus"] or (f"{b['deadline_beyond_budget_gpus']} (over budget)" if b.get("deadline_beyond_budget_gpus") else "-"),
               b["gpus_needed"] or "-"] for b in res["gpu_count"]]
    click.echo("\nGPU count = max(memory bound, deadline bound):")
    click.echo(table(rows, ["gpu", "network"] + (["stack"] if stacks else []) + ["memory bound", "deadline bound", "needed"],
                     align="ll" + ("l" if stacks else "") + "rrr"))
    shown = _rejected_kinds(res["rejected"])
    click.echo(f"\nrejected (most GPUs tried of each kind; --json lists all {len(res['rejected'])}):")
    for r in shown[:12]:
        click.echo(f"  {r['gpu']} x {r['gpus']}: {r['reason']}")
    if not res["plans"] and not res.get("unpriced") and job.get("deadline_days") and "deadline_days" not in changed \
            and any("deadline" in r["reason"] for r in res["rejected"]):
        click.echo(f"  (the {job['deadline_days']:g}-day deadline is the example job's: give --deadline-days "
                   "for yours, or --max-gpus for more GPUs)")


def _rejected_kinds(rejected: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One rejected candidate per GPU and kind of reason: the one with the most GPUs (the nearest miss).

    The kind is the reason without its stack prefix ("megatron-core: ") and without its figures, so
    "needs at least 6048 GiB ..." and "misses the 7-day deadline ..." are two kinds, not one.
    """
    import re

    out: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rejected:
        reason = r["reason"]
        if r.get("framework") and reason.startswith(r["framework"] + ": "):
            reason = reason[len(r["framework"]) + 2:]
        key = (r["gpu"], r.get("framework", ""), re.sub(r"[\d.,]+", "#", reason.split(":")[0])[:40])
        if key not in out or r["gpus"] >= out[key]["gpus"]:
            out[key] = r
    return list(out.values())


#: Job fields whose flag is not the field name (--gpu, repeatable, fills the job's ``gpus``)
_FLAG_OF = {"gpus": "--gpu", "gpus_per_node": "--gpus-per-node", "networks": "--network",
            "frameworks": "--search-framework"}
#: job flags that are the estimate's flags too (declared once in PlanInputs)
_SHARED_FLAGS = ("model", "framework", "liger_kernel", "moe_dispatcher", "model_loading", "moe_capacity_factor",
                 "moe_pad_to_capacity", "method", "precision", "optimizer", "attention", "seq_len", "doc_len", "tokens",
                 "lora_rank", "headroom", "host_ram_gib", "corpus")
#: the planner's own flags, generated from its Job fields
_JOB_FLAGS = ("global_batch", "batch_rounding", "deadline_days", "deadline_quantile", "max_gpus", "rank_by", "top")


def _example_default(name: str) -> str | None:
    """The help's default of a plan flag: the built-in example job's value where it is not the field's.

    ``plan`` with no flags plans EXAMPLE_JOB, and a flag changes one field of it; so the default a
    user gets is the example job's (20B tokens, 7 days, 64 GPUs, ranked by cost), which --help must say.
    """
    from trainledger.planner.search import EXAMPLE_JOB, Job

    value = getattr(EXAMPLE_JOB, name, None)
    info = Job.model_fields.get(name)
    if info is None or value is None or value == info.default:
        return None
    if name == "tokens":
        return f"{fmt_params(value)} tokens, the example job"
    return f"{value:g}, the example job" if isinstance(value, float) else f"{value}, the example job"


def _plan_options(func: Any) -> Any:
    from trainledger.load.plan import PlanInputs
    from trainledger.planner.search import Job
    from trainledger.cli.options import _field_option

    opts = [_field_option(n, PlanInputs.model_fields[n], _example_default(n)) for n in _SHARED_FLAGS]
    opts.insert(-1, click.option("--epochs", type=float, help="passes over the --corpus data [1]"))
    opts += [_field_option(n, Job.model_fields[n], _example_default(n)) for n in _JOB_FLAGS]
    opts += [
        click.option("--gpu", "gpus", multiple=True, help="candidate GPU (repeatable) [all catalog GPUs]"),
        click.option("--gpus-per-node", "gpus_per_node", type=int, multiple=True, help="node size (repeatable) [8]"),
        click.option("--network", "networks", multiple=True, help="inter-node network (repeatable) [ib-ndr]"),
        click.option("--tp-comm-overlap/--no-tp-comm-overlap", default=None,
                     help="override: the runtime overlaps TP collectives with GEMMs [the stack profile's]"),
        click.option("--runtime", type=click.Choice(["hf", "megatron"]),
                     help="override the stack profile's kernel fusion: hf (eager) or megatron (fused: "
                     "TE, Apex, torch.compile)"),
        click.option("--search-framework", "frameworks", multiple=True, type=click.Choice(FRAMEWORKS),
                     help="software stacks the planner compares (repeatable; a layout is a stack plus "
                     "degrees) [--framework]"),
        click.option("--ep-comm-overlap", is_flag=True, default=None,
                     help="the runtime hides the MoE all-to-all behind compute (DeepSeek DualPipe)"),
    ]
    for opt in reversed(opts):
        func = opt(func)
    return func


def register(main: click.Group) -> None:
    @main.command("plan")
    @_plan_options
    @cost_options
    @click.option("--json", "as_json", is_flag=True, help="print JSON")
    def plan_cmd(as_json: bool, **kw: Any) -> None:
        """Rank the hardware and layouts that fit a training job.

        With no arguments, plans the built-in example job: Llama-3.1-8B, full fine-tune
        (continued pre-training) on 20B tokens, global batch 256, 7-day deadline, every catalog
        GPU, up to 64 GPUs, cheapest first. Flags change that job field by field (--model,
        --tokens, --max-gpus ...). Exits 1 when no plan fits, so it can guard a launch script.
        """
        from trainledger.planner.search import search

        cost = cost_options_from_kwargs(kw)  # --price-per-gpu-hour, --provider, --pricing, --prices ...
        job, changed = _job(kw)
        if cost != job.cost_options:
            job = job.model_copy(update={"cost_options": cost})
        if sys.stderr.isatty():
            with click.progressbar(length=1, label="planning", file=sys.stderr) as bar:
                def progress(done: int, total: int) -> None:
                    bar.length = total
                    bar.update(done - bar.pos)

                res = search(job, progress)
        else:
            res = search(job)
        d = res.to_dict()
        if as_json:
            echo_json(d)
        else:
            _render(d, changed)
        if not d["plans"]:
            sys.exit(1)
