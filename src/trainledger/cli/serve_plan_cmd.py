"""`trainledger serve-plan`: the cheapest GPU type × TP × replicas meeting a load and latency SLOs.

Thin: flags -> PlanInputs -> ``trainledger.planner.serve.serve_plan`` -> render.
"""

from __future__ import annotations

from typing import Any

import click

from trainledger.units import fmt_seconds
from trainledger.cli.cost_opts import cost_options, cost_options_from_kwargs
from trainledger.cli.options import inputs_from_options, plan_options
from trainledger.cli.output import echo_json, table


def register(main: click.Group) -> None:
    main.add_command(serve_plan_cmd)


@click.command("serve-plan")
@plan_options
@cost_options
@click.option("--gpu-types", help="comma-separated catalog GPUs to try [every NVIDIA GPU; --gpu alone: that one]")
@click.option("--tps", default=None, help="tensor-parallel degrees to try [1,2,4,8; --tp N alone: N]")
@click.option("--top", type=int, default=8, show_default=True, help="candidates shown")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def serve_plan_cmd(gpu_types: str | None, tps: str | None, top: int, as_json: bool, **kwargs: Any) -> None:
    """Plan an inference deployment: for every GPU type and TP degree, the largest concurrency that
    meets the TTFT/TPOT SLOs, the replicas the load needs, and cost and energy per million output
    tokens. Prompt lengths: --seq-len, or --corpus STATS.json (median and p99).

    Example: trainledger serve-plan --model llama-3.1-8b --seq-len 2048 --generate-len 256
    --requests-per-s 20 --ttft-p99-s 2 --tpot-p99-s 0.08
    """
    from trainledger.planner.serve import serve_plan

    cost = cost_options_from_kwargs(kwargs)
    gpu = kwargs.get("gpu")
    if tps is None:  # --tp N alone narrows the search to N, as --gpu alone narrows it to that GPU
        tps = str(kwargs["tp"]) if kwargs.get("tp") else "1,2,4,8"
    elif kwargs.get("tp"):
        raise click.UsageError("give the tensor-parallel degrees once: --tp N or --tps 1,2,4,8")
    for key in ("gpus", "dp", "pp", "gpus_per_node"):  # the planner sizes each replica (tp GPUs) and counts them
        if kwargs.get(key) is not None:
            click.echo(f"warning: --{key.replace('_', '-')} is ignored: serve-plan sizes one replica as --tps GPUs "
                       "and counts the replicas the load needs", err=True)
            kwargs[key] = None
    corpus = kwargs.pop("corpus", None)
    inputs = inputs_from_options(dict(kwargs, method="inference"))
    names = [g.strip() for g in gpu_types.split(",") if g.strip()] if gpu_types else ([gpu] if gpu else None)
    try:
        tp_list = tuple(int(x) for x in tps.split(",") if x.strip())
    except ValueError:
        raise click.BadParameter(f"--tps {tps!r}: give comma-separated integers such as 1,2,4,8") from None
    res = serve_plan(inputs, names, tp_list, corpus, cost)
    if inputs.generate_len == 0:  # the planner sizes one output token per request: say so, never silently
        click.echo("note: no --generate-len: each request generates 1 token (prefill only), so TPOT and "
                   "$/M output tokens describe a prefill-only load; give --generate-len for chat or "
                   "completion traffic", err=True)
    if as_json:
        echo_json(res)
        return
    click.echo("\n".join(serve_plan_lines(res, top)))


def serve_plan_lines(res: dict[str, Any], top: int = 8) -> list[str]:
    pr = res["prompt_tokens"]
    slo = ", ".join(f"{k[:-2].replace('_', ' ')} ≤ {fmt_seconds(v)}" for k, v in res["slo"].items() if v) or "none"
    out = [f"serving plan: {res['model']} on {res['engine']} · {res['requests_per_s']:g} req/s · prompts p50 "
           f"{pr['p50']:,} / p99 {pr['p99']:,} tokens ({pr['source']}) · {res['output_tokens']:,} output tokens",
           f"SLOs: {slo}", ""]
    rows = []
    for c in res["candidates"][:top]:
        f, k = c["figures"], c["cost"]
        usd_m = k.get("cloud_usd_per_million_output_tokens")
        own_m = k.get("owned_usd_per_million_output_tokens")
        rows.append([c["gpu"], str(c["tp"]), str(c["replicas"]), str(c["gpus"]), str(c["concurrency_per_replica"]),
                     fmt_seconds(f["ttft_p99_s"]), fmt_seconds(f["tpot_p99_s"]),
                     f"{f['output_tokens_per_s_per_gpu']:,.0f}",
                     f"${k['cloud_usd_per_hour']:,.2f}" if "cloud_usd_per_hour" in k else "n/a",
                     f"${usd_m:,.3f}" if usd_m is not None else "n/a", f"${own_m:,.3f}" if own_m is not None else "n/a",
                     f"{k['kwh_per_million_output_tokens']:.2f}" if "kwh_per_million_output_tokens" in k else "n/a"])
    if rows:
        out += table(rows, ["gpu", "tp", "replicas", "GPUs", "conc", "TTFT p99", "TPOT p99", "tok/s/GPU",
                            "cloud $/h", "cloud $/M", "owned $/M", "kWh/M"], align="llrrrrrrrrrr").splitlines()
        b = res["best"]
        # ranked by cloud $/h, then GPU count: with no price for the first, it is the fewest GPUs, not the cheapest
        first = "cheapest" if "cloud_usd_per_hour" in b["cost"] else (
            "fewest GPUs (no cloud price for it: give --price-per-gpu-hour, --provider or --prices)")
        out.append(f"{first}: {b['replicas']} × {b['tp']}× {b['gpu']} (export it: trainledger export --to vllm "
                   f"--model {res['model']} --gpu {b['gpu']} --tp {b['tp']} --gpus {b['tp']} --method inference ...)")
    else:
        out.append("no GPU type and TP degree meets the SLOs at this load; relax an SLO or try other GPUs")
    if res["rejected"]:
        seen = {}
        for c in res["rejected"]:
            seen.setdefault(c["reason"].split(":")[0][:60], f"{c['gpu']} tp{c['tp']}: {c['reason']}")
        out.append(f"rejected {len(res['rejected'])} (e.g. " + "; ".join(list(seen.values())[:3]) + ")")
    return out
