"""`trainledger plan`: find the hardware and layouts that fit a job, ranked (the main job).

Thin: flags -> Job -> search() -> render. With no arguments it plans the built-in example job.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from ..recipe import ATTENTIONS, METHODS, OPTIMIZERS, PRECISIONS
from ..units import fmt_params, fmt_seconds
from .cost_opts import cost_options, cost_options_from_kwargs
from .options import _count
from .output import echo_json, table

_RANKS = ("time", "cost", "gpus")


def _job(kw: dict[str, Any]):
    from ..search import EXAMPLE_JOB, Job

    given = {k: v for k, v in kw.items() if v not in (None, (), False)}
    corpus, epochs = given.pop("corpus", None), given.pop("epochs", None)
    if corpus:
        from ..corpus.recommend import plan_hints

        hints = plan_hints(corpus)  # padded tokens per epoch and the sequence length they assume
        given.setdefault("seq_len", hints["seq_len"])
        given.setdefault("tokens", float(hints["tokens"]) * (epochs or 1.0))
    tpo = given.pop("tp_comm_overlap", False)
    epo = given.pop("ep_comm_overlap", False)
    runtime = given.pop("runtime", None)
    if not given and not tpo and not epo and runtime is None:
        return EXAMPLE_JOB, True
    from ..estimate.options import TimeOptions

    if tpo or epo or runtime:
        given["time_options"] = TimeOptions(tp_comm_overlap=tpo, ep_comm_overlap=epo,
                                            runtime=runtime or "hf")
    from pydantic import ValidationError

    from .._spec import spec_error

    try:
        return Job(**given), False
    except ValidationError as exc:
        raise spec_error(exc, "plan") from None


def _layout_text(lay: dict[str, Any]) -> str:
    parts = [f"dp{lay['dp']}"]
    for k in ("tp", "pp", "cp", "ep"):
        if lay[k] > 1:
            parts.append(f"{k}{lay[k]}")
    if lay["vp"] > 1:
        parts.append(f"v{lay['vp']}")
    s = "·".join(parts) + f" z{lay['zero']} mb{lay['micro_batch']}×{lay['grad_accum']}"
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
        gpuh = "-" if "gpu_hours" not in e else (
            f"{e['gpu_hours']:,.0f}" if e["gpu_hours"] >= 10 else f"{e['gpu_hours']:.2g}")
        rows.append([f"{i}{'*' if p['pareto'] and ranked else ''}", p["gpu"], p["gpus"], _layout_text(p["layout"]),
                     f"{e['memory_gib']:.1f}/{e['usable_gib']:.0f}", f"{e['step_time_s']:.2f}",
                     f"{e['tokens_per_s_per_gpu']:,.0f}", f"{100 * e['mfu']:.0f}%", days, gpuh, cost])
    return table(rows, ["#", "gpu", "gpus", "layout", "GiB used/usable", "step s", "tok/s/GPU", "MFU",
                        "time", "GPU-h", "cost"], align="llrllrrrrrr")


def _render(res: dict[str, Any], example: bool) -> None:
    job = res["job"]
    head = "built-in example job" if example else "job"
    tokens = f"{fmt_params(job['tokens'])} tokens" if job.get("tokens") else "no token budget"
    deadline = f", deadline {job['deadline_days']:g} days" if job.get("deadline_days") else ""
    click.echo(f"{head}: {job['model']} {job['method']} ({job['precision']}), seq {job['seq_len']}, "
               f"{tokens}{deadline}, up to {job['max_gpus']} GPUs; ranked by {job['rank_by']}")
    to = job["time_options"]
    click.echo(f"time model: {to['runtime']} runtime kernels, TP comm "
               f"{'overlapped' if to['tp_comm_overlap'] else 'exposed'}, MoE all-to-all "
               f"{'overlapped' if to['ep_comm_overlap'] else 'exposed'} "
               "(--runtime, --tp-comm-overlap, --ep-comm-overlap)")
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
    if res.get("unpriced"):
        click.echo(f"\nnot ranked: no price for {', '.join(res['unpriced_gpus'])} (give --price-per-gpu-hour, "
                   "--provider or a --prices FILE; `trainledger prices`); plans that fit, by GPU count:")
        click.echo(_plans_table(res["unpriced"], ranked=False))
    rows = [[b["gpu"], b["network"], b["memory_bound_gpus"] or "-", b["deadline_bound_gpus"] or "-",
             b["gpus_needed"] or "-"] for b in res["gpu_count"]]
    click.echo("\nGPU count = max(memory bound, deadline bound):")
    click.echo(table(rows, ["gpu", "network", "memory bound", "deadline bound", "needed"], align="llrrr"))
    seen, shown = set(), []
    for r in res["rejected"]:
        key = (r["gpu"], r["reason"].split(":")[0][:30])
        if key not in seen:
            seen.add(key)
            shown.append(r)
    click.echo(f"\nrejected (first of each kind; --json lists all {len(res['rejected'])}):")
    for r in shown[:12]:
        click.echo(f"  {r['gpu']} x {r['gpus']}: {r['reason']}")


def register(main: click.Group) -> None:
    @main.command("plan")
    @click.option("--model", "-m", help="preset name, config.json path or Hub id")
    @click.option("--method", type=click.Choice(METHODS), help="training method [full]")
    @click.option("--precision", type=click.Choice(PRECISIONS), help="precision policy [bf16-mixed]")
    @click.option("--optimizer", type=click.Choice(OPTIMIZERS), help="optimizer [adamw]")
    @click.option("--attention", type=click.Choice(ATTENTIONS), help="attention kernel [sdpa]")
    @click.option("--seq-len", type=int, help="sequence length [4096]")
    @click.option("--global-batch", type=int, help="samples per optimizer step [~1M tokens]")
    @click.option("--tokens", callback=_count, help="token budget, e.g. 20B")
    @click.option("--corpus", type=click.Path(dir_okay=False),
                  help="stats JSON of `trainledger corpus --json`: sets --seq-len and --tokens")
    @click.option("--epochs", type=float, help="passes over the --corpus data [1]")
    @click.option("--deadline-days", type=float, help="wall-clock deadline in days")
    @click.option("--max-gpus", type=int, help="GPU budget (largest count searched) [1024]")
    @click.option("--gpu", "gpus", multiple=True, help="candidate GPU (repeatable) [all catalog GPUs]")
    @click.option("--gpus-per-node", "gpus_per_node", type=int, multiple=True, help="node size (repeatable) [8]")
    @click.option("--network", "networks", multiple=True, help="inter-node network (repeatable) [ib-ndr]")
    @click.option("--lora-rank", type=int, help="LoRA rank [16]")
    @click.option("--headroom", type=float, help="memory kept free for the fit verdict [0.10]")
    @click.option("--rank-by", type=click.Choice(_RANKS), help="rank by time, cost or GPU count [time]")
    @click.option("--top", type=int, help="plans to show [10]")
    @click.option("--tp-comm-overlap", is_flag=True, default=False,
                  help="the runtime overlaps TP collectives with GEMMs (Megatron-Core + TE)")
    @click.option("--runtime", type=click.Choice(["hf", "megatron"]),
                  help="kernel fusion of the training runtime: hf (PyTorch eager + transformers) "
                  "or megatron (fused kernels) [hf]")
    @click.option("--ep-comm-overlap", is_flag=True, default=False,
                  help="the runtime hides the MoE all-to-all behind compute (DeepSeek DualPipe)")
    @cost_options
    @click.option("--json", "as_json", is_flag=True, help="print JSON")
    def plan_cmd(as_json: bool, **kw: Any) -> None:
        """Rank the hardware and layouts that fit a training job.

        With no arguments, plans the built-in example job: Llama-3.1-8B, full fine-tune
        (continued pre-training) on 20B tokens, 7-day deadline, every catalog GPU, up to 64 GPUs,
        cheapest first.
        """
        from ..search import search

        cost = cost_options_from_kwargs(kw)  # --price-per-gpu-hour, --provider, --pricing, --prices ...
        job, example = _job(kw)
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
            _render(d, example)
