"""Accuracy of the time model against measured training throughput (issue 4 proof).

Predicts every ground-truth case the Plan model can express (../shared/groundtruth/*.yaml, or
$TRAINLEDGER_GROUNDTRUTH) and prints, per case, the measured figure, the prediction and the
absolute error of the throughput (tokens/s per GPU, TFLOP/s per GPU or step time — whatever the
case measured; all compare as rates, error = |pred/meas - 1|). Targets: median <= 10%, no case
> 20%. One set of efficiency parameters per GPU family (catalog/efficiency/) and one stack profile per
framework (catalog/efficiency/stacks/): each case runs under the stack it ran on, no per-case knobs.
The summary prints one table per stack and GPU family.

Facts a case does not state are filled by one rule for all cases of its source, printed below:
    micro-batch 1 where unstated; 1F1B without interleaving where unstated; dropout 0.1 for
    Megatron-LM GPT runs (its default --attention-dropout/--hidden-dropout), NeMo's below, 0 elsewhere;
    Megatron 2021 heads from SC21 Table 1 (arXiv:2104.04473), TP = min(MP, 8), PP = MP/TP;
    NeMo 24.07 rows: dropout, the fused loss and recomputation of the model family's NeMo Framework
    Launcher 24.07 config, its Apex distributed_fused_adam, and the release's FP8 settings
    (grad_sync_dtype bf16, fp8_params; see NEMO_FP8); Megatron-LM Llama examples: the example
    script's fused loss, --grad-reduce-in-bf16 and --fp8-param-gather;
    Megatron-Core / NeMo runs: distributed optimizer (ZeRO-1), TE flash attention (framework
    megatron-core; its Hopper profile overlaps TP comm as the NeMo recipes do); Megatron-LM 2021/2022
    runs predate Megatron-Core: framework megatron-core on Ampere (fused Apex kernels, no TP
    overlap, the same profile); BLOOM: megatron-deepspeed; MosaicML llm-foundry: pytorch-fsdp
    (FSDP1, eager modules), MPTConfig defaults (learned positions, biases), its default Triton
    FlashAttention kernel (attention flash1) and llm-foundry's default fused cross-entropy
    (flash-attn); torchtitan: fsdp2 (its defaults: loss parallel with TP, no reshard after forward
    with PP; recompute "selective (op)" is its per-op SAC), torch.compile rows with fused kernels
    (--kernels fused), AsyncTP rows with --tp-comm-overlap (both plan fields), Float8 rows fp8-mixed (the 2024-12
    benchmark's techniques read from its table captions, which cover every row of the table; the
    2024-08 405B Float8 rows compiled, as the preset committed with that table), H100
    rows on the 96 GB HBM2e part at --power-limit-w 500; Llama 2: pytorch-fsdp (Meta's FSDP + xformers
    stack, layout assumed); our H200 rows (bench/results/time_cuda_h200.json): hf, one GPU, the
    hf profile's host step added to the measured step (verify's StepRunner runs no Trainer loop).

Rows whose source states the memory it measured (torchtitan: max reserved GiB) also print the
plan's predicted reserved memory beside it, and the summary their error: a check that the bench's
plans state the runs (recompute, batch, loss, sharding), which the time model's allocator-retry
term (estimate/time/allocator.py) reads.

After the summary, a model-free consistency screen of the measured rows (bench/source_screen.py:
rows of one source table that no implementation could produce together, found by physical rules
without any estimate), with the count of cases > 20% it flags; evidence, not a filter.

Usage: python bench/time_accuracy.py [--json] [--all] [--write-intervals]
(--all also shows secondary cases; --write-intervals stores the per-stack residual intervals;
--json adds the screen as the key ``source_screen`` beside ``rows`` and ``summary``)
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from trainledger.load.catalog import load_gpu, load_network
from trainledger.spec.cluster import Cluster
from trainledger.estimate.time.compute import narayanan_flops_per_iteration
from trainledger.estimate.memory import estimate_memory
from trainledger.estimate.options import MemoryOptions, TimeOptions
from trainledger.estimate.time import estimate_compute, estimate_time
from trainledger.load.hf import from_hf_config, load_model
from trainledger.load.plan import PlanInputs, build_plan
from trainledger.estimate.time.stack import stack_profile
from trainledger.spec.layout import Layout
from trainledger.spec.plan import Plan
from trainledger.spec.recipe import Recipe
from trainledger.spec.runtime import Runtime
from trainledger.estimate.time.efficiency import for_gpu

GT = Path(os.environ.get("TRAINLEDGER_GROUNDTRUTH", Path(__file__).resolve().parents[2] / "shared" / "groundtruth"))
if not GT.exists():
    GT = Path("/work/shared/groundtruth")

#: share of wall-clock spent on useful steps in Meta's large runs (Llama 3, arXiv:2407.21783, §3.3.4)
EFFECTIVE_TRAINING_TIME = 0.90

#: no overrides: the stack profile of the case's framework decides
STACK = TimeOptions()

#: Llama 2 model-card GPU-hour cases -> bundled presets
LLAMA2 = {"llama2-7B-gpu-hours": "llama-2-7b", "llama2-13B-gpu-hours": "llama-2-13b",
          "llama2-70B-gpu-hours": "llama-2-70b"}

#: SC21 Table 1 (Narayanan et al. 2021, arXiv:2104.04473): attention heads by hidden size.
SC21_HEADS = {2304: 24, 3072: 32, 4096: 32, 6144: 48, 8192: 64, 10240: 80, 12288: 96,
              16384: 128, 20480: 128, 25600: 160}


@dataclass
class Case:
    id: str
    source: str
    plan: Plan
    opts: TimeOptions
    metric: str          # 'tokens_per_s_per_gpu' | 'tflops_96' | 'model_tflops' | 'step_time_s' | 'gpu_hours'
    measured: float
    secondary: bool = False
    note: str = ""
    #: memory the source measured (torchtitan: ``max_reserved_gib``, torch.cuda.max_memory_reserved,
    #: of its metrics log line), compared with the plan's predicted reserved bytes: a check that
    #: the bench's plan states the run (a plan that misstates recompute/batch/loss shows up here)
    memory_gib: float | None = None

    @property
    def stack(self) -> str:
        return self.plan.runtime.framework

    @property
    def family(self) -> str:
        return for_gpu(self.plan.cluster.gpu).family


def gpt(h: int, L: int, a: int, V: int, s: int, ffn: int | None = None, kv: int | None = None,
        gated: bool = False, pos: str = "learned", norm: str = "layernorm", bias: bool = True,
        tied: bool = True, name: str = "gpt"):
    cfg = {"model_type": "generic", "hidden_size": h, "num_hidden_layers": L,
           "num_attention_heads": a, "num_key_value_heads": kv or a,
           "intermediate_size": ffn or 4 * h, "vocab_size": V, "tie_word_embeddings": tied,
           "mlp_type": "gated" if gated else "plain", "norm_type": norm, "bias": bias,
           "position_embedding": pos, "max_position_embeddings": s, "hidden_act": "gelu"}
    return from_hf_config(cfg, name=name)


def cluster(gpu: str, gpus: int, per_node: int = 8, inter: str = "ib-hdr", nics: int | None = None,
            intra: str | None = None, power_limit_w: float | None = None) -> Cluster:
    g = load_gpu(gpu)
    if power_limit_w:
        g = g.model_copy(update={"power_limit_w": power_limit_w})
    nodes = max(1, gpus // per_node)
    return Cluster(gpu=g, gpus_per_node=min(per_node, gpus), nodes=nodes,
                   intra=load_network(intra or g.link),
                   inter=load_network(inter) if nodes > 1 else None,
                   nics_per_node=nics or min(per_node, gpus))


def plan(model, cl: Cluster, *, tp=1, pp=1, cp=1, dp=None, vp=1, zero=0, sp=None, mbs=1, gbs=None, ep=1,
         seq=2048, precision="bf16-mixed", recompute="none", attention="flash", dropout=0.0,
         framework="megatron-core", recompute_layers=None, method="pretrain", lora=None,
         fused_loss=False, reduce_dtype="fp32", dist_optimizer="mcore", fp8_params=False) -> Plan:
    extra = {"lora_targets": lora[0], "lora_rank": lora[1]} if lora else {}
    rec = Recipe(method=method, precision=precision, seq_len=seq, micro_batch=mbs,
                 global_batch=gbs, recompute=recompute, attention=attention, dropout=dropout,
                 recompute_layers=recompute_layers, **extra)
    lay = Layout(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, vp=vp, zero=zero, sp=(tp > 1) if sp is None else sp,
                 pp_schedule="interleaved" if vp > 1 else "1f1b")
    return Plan(model=model, recipe=rec, layout=lay, cluster=cl,
                runtime=Runtime(framework=framework, fused_loss=fused_loss, reduce_dtype=reduce_dtype,
                                dist_optimizer=dist_optimizer, fp8_params=fp8_params))


def _load(name: str) -> list[dict[str, Any]]:
    return yaml.safe_load((GT / name).read_text())["cases"]


def megatron_cases() -> list[Case]:
    out = []
    for c in _load("megatron_lm_readme_scaling.yaml"):
        d, s, m = c.get("model_dims", {}), c["setup"], c["measured"]
        cid = c["id"]
        if cid.startswith("megatron-a100-2021"):
            h, L, V, seq = d["hidden"], d["layers"], d["vocab"], d["seq_len"]
            mp = s["model_parallel_size_tp_x_pp"]
            tp = min(mp, 8)
            mdl = gpt(h, L, SC21_HEADS[h], V, seq, name=c["model"])
            p = plan(mdl, cluster("a100-sxm-80gb", s["gpus"]), tp=tp, pp=mp // tp, dp=s["dp"],
                     gbs=s["gbs"], seq=seq, precision="fp16-mixed", recompute="full",
                     attention="eager", dropout=0.1, sp=False)
            out.append(Case(cid, "megatron-2021", p, STACK, "tflops_96", m["tflops_per_gpu"]))
        elif cid == "megatron-a100-gpt3-175b-example":
            mdl = gpt(12288, 96, 96, 51200, 2048, name="GPT-3 175B")
            p = plan(mdl, cluster("a100-sxm-80gb", s["gpus"]), tp=8, pp=16, dp=8, gbs=s["gbs"],
                     precision="fp16-mixed", recompute="full", attention="eager", dropout=0.1, sp=False)
            out.append(Case(cid, "megatron-2021", p, STACK, "step_time_s", m["step_time_s"]))
        elif cid.startswith("mcore-h100-2024") and "strong" not in cid:
            seq = d["seq_len"]
            mdl = gpt(d["hidden"], d["layers"], d["heads"], d["vocab"], seq, ffn=d["ffn"],
                      kv=d["kv_heads"], pos="rope", tied=False, name=c["model"])
            p = plan(mdl, cluster("h100-sxm", s["gpus"], inter="ib-ndr"), tp=s["tp"], pp=s["pp"],
                     dp=s["dp"], zero=1, gbs=s["gbs"], seq=seq, dropout=MEGATRON_LM_DROPOUT)
            out.append(Case(cid, "mcore-2024", p, STACK,
                            "model_tflops", m["tflops_per_gpu"]))
        elif cid.startswith("mlm-llama-example"):
            mdl = gpt(d["hidden"], d["layers"], d["heads"], d["vocab"], s["seq_len"], ffn=d["ffn"],
                      kv=d["kv_heads"], gated=True, pos="rope", norm="rmsnorm", bias=False,
                      tied=False, name=c["model"])
            p = plan(mdl, cluster("h100-sxm", s["gpus"], inter="ib-ndr"), tp=s["tp"], pp=s["pp"],
                     cp=s["cp"], vp=s["vp"], zero=1, mbs=s["mbs"], gbs=s["gbs"], seq=s["seq_len"],
                     precision="fp8-mixed", fused_loss=True, **MLM_LLAMA_FLAGS)  # the script's flags
            out.append(Case(cid, "mcore-llama-fp8", p, STACK,
                            "tokens_per_s_per_gpu", m["tokens_per_s_per_gpu"]))
    return out


def korthikanti_cases() -> list[Case]:
    out = []
    for c in _load("korthikanti_2022_activation_recompute.yaml"):
        m = c.get("measured") or {}
        if "step_time_s" not in m:
            continue
        d, s = c["model_dims"], c["setup"]
        mdl = gpt(d["hidden"], d["layers"], d["heads"], d["vocab"], d["seq_len"], name=c["model"])
        p = plan(mdl, cluster("a100-sxm-80gb", s["gpus"]), tp=s["tp"], pp=s["pp"], dp=s["dp"],
                 vp=s["vp_interleave"], mbs=s["mbs"], gbs=s["gbs"], seq=d["seq_len"],
                 precision="fp16-mixed", recompute=s["recompute"], attention="eager",
                 dropout=0.1, sp=s["sequence_parallel"])
        out.append(Case(c["id"], "korthikanti-2022", p, STACK, "step_time_s", m["step_time_s"]))
    return out


def mosaic_cases() -> list[Case]:
    out = []
    for c in _load("mosaicml_llm_foundry_mpt_a100.yaml"):
        d, s, m = c["model_dims"], c["setup"], c["measured"]
        gpu = "a100-sxm-80gb" if s["gpu_type"] == "a100_80gb" else "a100-sxm-40gb"
        # The benchmark ran MPTConfig's defaults where the yamls are silent (llm-foundry @ b2a43a1,
        # the commit that wrote these tables: scripts/train/yamls/pretrain/mpt-*.yaml set no
        # attn_config.alibi and no no_bias; llmfoundry/models/mpt/configuration_mpt.py: alibi False,
        # learned_pos_emb True, no_bias False): learned positions (max_seq_len x d_model) and
        # biases. The table's NumParams says the same: it grows with the sequence length by
        # d_model per position and equals this count exactly (tests/golden/test_time_golden.py).
        # Attention: submit_benchmarks.py's default --attn_impl triton, the Triton FlashAttention
        # kernel (llmfoundry/models/layers/flash_attn_triton.py): FA1 generation, causal block skip.
        mdl = gpt(d["hidden"], d["layers"], d["heads"], d["vocab"], s["seq_len"], ffn=d["ffn"],
                  pos="learned", bias=True, tied=True, name=c["model"])
        # Composer's precision 'bf16' is autocast mixed precision, not bf16 weights (composer/core/
        # precision.py: "BF16: Use 16-bit BFloat mixed precision"): fp32 sharded parameters and
        # optimizer states in both tables. The FSDP reduce dtype: Composer's mixed_precision 'PURE'
        # sets reduce_dtype bf16. 'DEFAULT' sets param_dtype bf16 and, from composer 0.16.4
        # (d745fcb1b, 2023-10-10, "patch default"), reduce_dtype fp32: the 80 GB table's runs
        # (llm-foundry b2a43a1 pins mosaicml>=0.16.4). Before it 'DEFAULT' left reduce_dtype None
        # (composer 0.14, pinned by 5f43bf160: the 40 GB table and the 80 GB 70B rows), and torch
        # 1.13's FSDP then reduces the gradient in the dtype backward made it, bf16
        # (_post_backward_hook casts only when reduce_dtype is set; torch 2's FSDP1 infers
        # reduce_dtype = param_dtype, the same result: torch/distributed/fsdp/api.py MixedPrecision).
        prec = "bf16-mixed"
        torch_113 = not (s["gpu_type"] == "a100_80gb" and s["precision"] == "amp_bf16")
        reduce = "bf16" if s.get("mp_mode") == "PURE" or torch_113 else "fp32"
        p = plan(mdl, cluster(gpu, s["gpus"], inter="roce-200"), dp=s["gpus"], zero=3,
                 mbs=s["mbs"], gbs=s["gbs"], seq=s["seq_len"], precision=prec,
                 recompute=s["recompute"], attention="flash1", framework="pytorch-fsdp")
        # llm-foundry's MPT trains with flash-attn's fused cross-entropy unless a yaml says otherwise
        # (llmfoundry/models/mpt/modeling_mpt.py ``ComposerMPTCausalLM``: loss_fn defaults to
        # 'fused_crossentropy'; the benchmark yamls, scripts/train/benchmarking, set no loss_fn)
        # Full recompute: llm-foundry's yamls checkpoint non-reentrantly (activation_checkpointing_
        # reentrant: false), whose early stop exists from torch 2.1. The A100 80 GB amp_bf16 rows were
        # rerun on the mosaicml/pytorch:2.1.0_cu121 image (scripts/train/benchmarking/sweep.sh
        # @ b2a43a1, 2023-10-19, the commit that rewrote that table); the 40 GB table and the 80 GB
        # 70B bf16/PURE rows date from 5f43bf160 (2023-05-03), whose setup.py pins torch==1.13.1
        early_stop = not torch_113
        # Optimizer: the yamls of both commits set ``optimizer: name: decoupled_adamw``, Composer's
        # DecoupledAdamW, whose step is a per-tensor loop (composer/optim/decoupled_weight_decay.py,
        # DecoupledAdamW.adamw: ``for i, param in enumerate(params)``)
        p = p.model_copy(update={"runtime": Runtime(framework="pytorch-fsdp", fused_loss=True,
                                                    reduce_dtype=reduce,
                                                    checkpoint_early_stop=early_stop),
                                 "recipe": p.recipe.model_copy(update={"optimizer": "adamw-loop"})})
        out.append(Case(c["id"], "mosaicml", p, STACK, "tokens_per_s_per_gpu",
                        m["tokens_per_s_per_gpu"]))
    return out


def reported_cases() -> list[Case]:
    out = []
    for c in _load("training_runs_reported.yaml"):
        s, m = c.get("setup", {}), c.get("measured", {})
        if c["id"] == "bloom-176b":
            d = c["model_dims"]
            mdl = gpt(d["hidden"], d["layers"], d["heads"], d["vocab"], d["seq_len"], pos="alibi",
                      name="BLOOM-176B")
            cl = cluster("a100-sxm-80gb", s["gpus"], per_node=4, inter="ib-edr", nics=4)
            p = plan(mdl, cl, tp=s["tp"], pp=s["pp"], dp=s["dp"], zero=1, mbs=s["mbs"],
                     gbs=s["gbs"], recompute="full", attention="eager", sp=False,
                     framework="megatron-deepspeed")
            out.append(Case(c["id"], "bloom", p, STACK, "step_time_s", m["step_time_s"],
                            note="OmniPath 100G modelled as IB EDR 100G"))
        elif c["id"] == "mlperf-v3.1-gpt3-nvidia-eos":
            mdl = gpt(12288, 96, 96, 51200, 2048, name="GPT-3 175B")
            p = plan(mdl, cluster("h100-sxm", s["gpus"], inter="ib-ndr"), tp=s["tp"], pp=s["pp"],
                     dp=s["dp"], zero=1, gbs=s["gbs"], precision="fp8-mixed")
            out.append(Case(c["id"], "mlperf", p, STACK,
                            "step_time_s", m["iteration_time_s"], secondary=True))
        elif c["id"] in LLAMA2:
            # Layout not published: assumed FSDP (ZeRO-3) over 1024 A100-80GB, 4M-token batches
            # (1024 x 4096), activation checkpointing, flash attention. GPU-hours include failures
            # and restarts: predicted hours / EFFECTIVE_TRAINING_TIME (tests/golden/test_time_anchors.py)
            mdl = load_model(LLAMA2[c["id"]])
            p = plan(mdl, cluster("a100-sxm-80gb", 1024, inter="ib-hdr"), dp=1024, zero=3,
                     gbs=1024, seq=4096, recompute="full", framework="pytorch-fsdp")
            p = p.model_copy(update={"recipe": p.recipe.model_copy(update={"train_tokens": s["tokens"]})})
            out.append(Case(c["id"], "llama2", p, STACK, "gpu_hours", m["gpu_hours"],
                            secondary=True, note="layout assumed; GPU-hours include restarts"))
        elif c["id"] == "deepseek-v3":
            # DeepSeek-V3 tech report (arXiv:2412.19437) §3: 2048 H800, PP16, EP64, ZeRO-1, no TP,
            # FP8, DualPipe overlapping the all-to-all, seq 4096, batch up to 15360 sequences.
            # GPU-hours include context extension and post-training: a loose, secondary check.
            mdl = load_model("deepseek-v3")
            # DualPipe bubble ~1/3 of 1F1B (report Table 2 with B = 2F, W = B/2), stood in for by 3
            # virtual stages; 61 layers leave 4 per stage, so the deepest of 3 chunks is 2 layers and
            # the interleaved bubble charged is 1/2 of 1F1B (estimate/time/step.py chunk_share), not
            # DualPipe's 0.31 -- the schedule itself is not modelled
            p = plan(mdl, cluster("h800", 2048, inter="ib-ndr"), pp=16, vp=3, ep=64, dp=128, zero=1,
                     gbs=15360, seq=4096, precision="fp8-mixed")
            p = p.model_copy(update={"recipe": p.recipe.model_copy(update={"train_tokens": m["pretrain_tokens"]}),
                                     "runtime": p.runtime.model_copy(update={"ep_comm_overlap": True})})
            out.append(Case(c["id"], "deepseek", p, STACK, "gpu_hours",
                            m["gpu_hours_full_training_H800"], secondary=True,
                            note="total GPU-hours incl. context extension and post-training"))
        elif c["id"] == "megascale-175b-secondary":
            mdl = gpt(12288, 96, 96, 51200, 2048, name="GPT-3 175B")
            p = plan(mdl, cluster("a100-sxm-80gb", s["gpus"], inter="roce-200"), tp=s["tp"],
                     pp=s["pp"], dp=s["dp"], zero=1, gbs=s["gbs"])
            out.append(Case(c["id"], "megascale", p, STACK,
                            "step_time_s", m["iteration_time_s"], secondary=True))
    return out


def _titan_gpu(text: str) -> tuple[str, float | None, str]:
    """torchtitan hardware: (catalog GPU, power limit W, inter-node network)."""
    if text.startswith("H100"):
        # Grand Teton: 500 W H100 96 GB HBM2e, 400 Gb/s RDMA (RoCE) per GPU (torchtitan benchmark notes)
        return "h100-sxm-96gb", 500.0, "roce-400"
    if text.startswith("H200"):
        return "h200", None, "ib-ndr"  # 400 Gb/s per GPU (Trainy post)
    return "a100-sxm-80gb", None, "ib-hdr"  # not stated: 200 Gb/s per GPU assumed


def _titan_recompute(text: str, layers: int) -> tuple[str, int | None]:
    t = str(text).lower()
    if t.startswith("full"):
        return "full", None
    if "layer" in t:  # torchtitan selective layer AC: every 2nd layer checkpointed (ac_freq 2)
        return "full", layers // 2
    if t.startswith("selective"):  # op-level SAC: matmul outputs kept, the rest recomputed
        return "selective", None
    return "none", None


#: techniques a torchtitan table states in its caption but the case rows do not repeat
#: (benchmarks/llama3_h100_202412_torchtitan.md @ 9dec370: "Table 6 4D parallelism (FSDP + TP + PP
#: + CP) + torch.compile + Float8 + AsyncTP + 1F1B"); the other tables' captions are in ``table``.
TITAN_CAPTIONS = {"Table 6": "torch.compile float8 asynctp"}

#: the 2024-08 405B table (docs/performance.md @ 9515a140b) names the optimizations it compares,
#: not the preset they ran on: the commit that published it set train_configs/llama3_405b.toml to
#: compile = true with Float8 and Async TP (its best row), and Async TP refuses to run without
#: compile (torchtitan/parallelisms/parallelize_llama.py @ 9515a140b: "Async TP requires
#: --training.compile"); the rows with Float8 are read as compiled, the row without as the
#: earlier preset's compile = false.
TITAN_2408_SOURCE = "docs/performance.md @ 9515a140b"

#: torchtitan compiles the loss with the model from April 2025 on (github:pytorch/torchtitan
#: torchtitan/components/loss.py ``build_cross_entropy_loss`` @ bbb1b616e, 2025-04-02: "if
#: job_config.training.compile: loss_fn = torch.compile(loss_fn)"; in the 2024 benchmarks' train.py
#: that line was still commented out, removed as such by d1f62be73, 2025-02-20). Inductor fuses the
#: fp32 up-cast, log-softmax and its gradient into kernels over the 16-bit logits: the logits are kept
#: once, with no fp32 copy or log-softmax output (Runtime.fused_loss's memory meaning on the PyTorch
#: stacks). Tables by their YYMM id prefix.
TITAN_LOSS_COMPILED_FROM = 2504
#: torchtitan's AdamW is fused from 2025-02-24 on ([optimizer] implementation = "fused" by default:
#: pytorch/torchtitan PR #881, commit 6e4988550); before it torch's foreach AdamW
TITAN_FUSED_ADAMW_FROM = 2502
#: torchtitan's full AC passes early_stop=False to torch's non-reentrant checkpoint from 2025-08-29 on
#: (pytorch/torchtitan PR #1580, commit 25413d224); the tables before it ran torch's default, early stop
TITAN_NO_EARLY_STOP_FROM = 2508


def torchtitan_cases() -> list[Case]:
    out = []
    for c in _load("torchtitan_throughput.yaml"):
        d, s, m = c["model_dims"], c["setup"], c["measured"]
        yymm = int(c["id"].split("-")[1])  # the table, by its id prefix
        gpu, watts, net = _titan_gpu(str(s["gpu_type"]))
        par = s["parallelism"]
        tp, pp, cp, dps = par["tp"], par["pp"], par["cp"], par["dp_shard"]
        mdl = load_model(d["preset"]) if d.get("preset") else load_model(
            {"Llama 3.1 405B": "llama-3.1-405b", "Llama 3.1 70B": "llama-3.1-70b",
             "Llama 3 70B": "llama-3.1-70b", "Llama 3 8B": "llama-3.1-8b",
             "Llama 2 13B": "llama-2-13b", "Llama 2 70B": "llama-2-70b"}[c["model"]])
        # the 2024-12 benchmark's "Table N (...)" captions state compile / Float8 / AsyncTP for
        # the whole table (other sources' table names are titles, e.g. "Async TP benchmark")
        table = str(c.get("table", "")) if str(c.get("table", "")).startswith("Table ") else ""
        text = " ".join(str(x) for x in (s.get("framework"), s.get("techniques"), c["id"], table,
                                         TITAN_CAPTIONS.get(table.split(" (")[0], ""))).lower()
        prec = str(s.get("precision", "bf16")).lower()
        fp8 = "float8" in prec and ("float8" in text or "float8" in prec.split("(")[0])
        if "rowwise" in text:
            continue  # torchao rowwise-scaled float8: a recipe the time model does not express
        gbs = s["gbs"]
        mbs = s["mbs"] if isinstance(s["mbs"], int) else None
        vp = 2 if "interleaved" in c["id"] else 1
        if mbs is None:  # "local batch N per DP rank": torchtitan splits it into pp micro-batches
            mbs = max(1, (gbs // (dps * cp)) // pp)
        rc, rcl = _titan_recompute(s.get("recompute", "none"), mdl.num_layers)
        cl = cluster(gpu, s["gpus"], inter=net, power_limit_w=watts)
        p = plan(mdl, cl, tp=tp, pp=pp, cp=cp, dp=dps, vp=vp, zero=3, mbs=mbs, gbs=gbs,
                 seq=s["seq_len"], precision="fp8-mixed" if fp8 else "bf16-mixed",
                 recompute=rc, recompute_layers=rcl, framework="fsdp2")
        if yymm >= TITAN_FUSED_ADAMW_FROM:
            p = p.model_copy(update={"recipe": p.recipe.model_copy(update={"optimizer": "adamw-fused"})})
        if TITAN_2408_SOURCE in str(c.get("source", "")) and fp8:
            text += " torch.compile"
        # torchtitan applies loss parallel whenever TP is on (--parallelism.disable_loss_parallel
        # defaults to False: torchtitan/config/job_config.py; train.py ``loss_parallel_enabled``) and,
        # with PP, keeps the gathered parameters between micro-batches ("For PP, by default do not
        # reshard after forward to avoid per-microbatch all-gathers": torchtitan/distributed/fsdp.py
        # ``get_fsdp_reshard_after_forward_policy`` @ b5bcd76, policy "default"; the same rule as
        # Runtime.default_reshard_after_forward)
        compiled_loss = "compile" in text and yymm >= TITAN_LOSS_COMPILED_FROM
        # compiled rows run fused kernels, AsyncTP rows overlap their TP collectives: stated in the
        # plan, as the torchtitan importer reads [compile] enable and enable_async_tensor_parallel
        p = p.model_copy(update={"runtime": Runtime(
            framework="fsdp2", loss_parallel=tp > 1, reshard_after_forward=pp == 1,
            fused_loss=compiled_loss, kernels="fused" if "compile" in text else None,
            tp_comm_overlap=True if "asynctp" in text.replace(" ", "") else None,
            checkpoint_early_stop=True if yymm < TITAN_NO_EARLY_STOP_FROM else None)})  # None: fsdp2's default
        out.append(Case(c["id"], "torchtitan", p, STACK, "tokens_per_s_per_gpu",
                        m["tokens_per_s_per_gpu"], memory_gib=m.get("memory_gib")))
    return out


#: NeMo 24.07 model dims not in the table: NeMo recipe configs (gpt3_5b/20b: GPT-2 BPE padded to
#: 50304, learned positions, GELU MLP 4h; nemotron3_8b/22b and Nemotron-4 340B: 256k vocab,
#: squared-ReLU MLP, RoPE); each checked against the table's own model TFLOP/s ÷ tokens/s.
NEMO_DIMS = {
    "GPT3-5B": dict(h=4096, L=24, a=32, V=50304), "GPT3-20B": dict(h=6144, L=44, a=48, V=50304),
    "GPT3-175B": dict(h=12288, L=96, a=96, V=50304),
    "Nemotron-8B": dict(h=4096, L=32, a=32, V=256000, ffn=16384, pos="rope", bias=False, tied=False),
    "Nemotron-22B": dict(h=6144, L=40, a=48, V=256000, ffn=24576, pos="rope", bias=False, tied=False),
    "Nemotron-340B": dict(h=18432, L=96, a=96, kv=8, V=256000, ffn=73728, pos="rope", bias=False,
                          tied=False),
}


#: Dropout and the fused cross-entropy of the NeMo 24.07 runs, by model family, from the NeMo
#: Framework Launcher's training configs of that release (github:NVIDIA/NeMo-Framework-Launcher @
#: tag 24.07, launcher_scripts/conf/training/<family>/*.yaml): gpt3 5b/20b/175b set
#: hidden_dropout = attention_dropout = 0.1 and no cross_entropy_loss_fusion; llama2 dropout 0, no
#: fusion; llama3 8b/70b and nemotron 8b/22b set cross_entropy_loss_fusion: true, dropout 0
#: (unset fusion = Megatron-Core's default False, megatron/core/model_parallel_config.py @ core_r0.8.0)
NEMO_DROPOUT = {"GPT3": 0.1}
NEMO_FUSED_LOSS = ("LLAMA3", "Nemotron")
#: Megatron-LM's --attention-dropout / --hidden-dropout default (megatron/training/arguments.py @
#: core_r0.8.0), for Megatron-LM GPT runs that do not state theirs
MEGATRON_LM_DROPOUT = 0.1


#: NeMo 24.07's optimizer and FP8 weight storage (NeMo Framework Launcher @ tag 24.07, 8325688d).
#: Every config of these models (launcher_scripts/conf/training/{gpt3,llama,nemotron}/*.yaml, and
#: conf/peft/llama/sft.yaml for SFT/LoRA) trains with ``optim.name: distributed_fused_adam``
#: (Apex DistributedFusedAdam via NeMo's MegatronDistributedFusedAdam) and bf16 weights
#: (``megatron_amp_O2: true``). Those family configs are BF16 recipes (``fp8: False``) and do not
#: describe the table's FP8 runs; the release's FP8 training configs (gpt3/175b_fp8.yaml,
#: gpt3/mlperf.yaml, gpt3/mlperf-24n.yaml) all set ``grad_sync_dtype: bf16`` and its FP8
#: performance configs (mlperf*.yaml, the 512-GPU GPT3-175B row links to MLPerf) ``fp8_params:
#: true``, which every FP8 row takes. (Read literally, the family configs' defaults, fp32 gradient
#: buffer and bf16 weights beside Transformer Engine's cached fp8 copies, do not fit GPT3-20B,
#: LLAMA3-8B or the 512-GPU GPT3-175B in 80 GB, yet those runs were measured.)
#: nemotron_340b.yaml sets ``activations_checkpoint_granularity: selective``; the others no
#: recomputation; sequence parallelism exactly where TP > 1 (as ``plan`` sets it).
NEMO_FP8 = dict(dist_optimizer="apex", reduce_dtype="bf16", fp8_params=True)
NEMO_SELECTIVE = ("Nemotron-340B",)
#: Megatron-LM examples/llama/train_llama3_8b_h100_fp8.sh (@ bf6e99859f, the commit that added the
#: example and its table): --grad-reduce-in-bf16, --fp8-param-gather, --use-distributed-optimizer
MLM_LLAMA_FLAGS = dict(reduce_dtype="bf16", fp8_params=True)


#: NeMo's LoRA default: adapters on the fused QKV projection only, adapter_dim 32 (NeMo
#: examples/nlp/language_modeling/tuning/conf/megatron_gpt_finetuning_config.yaml, peft.lora_tuning)
NEMO_LORA = (("q_proj", "k_proj", "v_proj"), 32)


#: NeMo 24.07's fine-tuning rows train on SQuAD packed to 4096 tokens (nemo_24_07_perf.yaml notes),
#: NeMo's packed SFT: each example attends only to itself (cu_seqlens, Transformer Engine's THD
#: format; docs.nvidia.com/nemo-framework/user-guide/24.07 .../optimizations/sequence_packing.html).
#: Mean example length, an estimate: TFDS squad/v1.1 holds 98,169 examples in 94.06 MiB, ~1,000
#: bytes each with context, question, answer, title and id; at ~4 characters per Llama-2 token
#: that is at most ~250 tokens, with the prompt template ~256. The rows barely depend on it: 192
#: or 512 move their predictions by less than 1.5% (attention then is a few % of the step).
NEMO_SQUAD_DOC_LEN = 256


def nemo_cases() -> list[Case]:
    out = []
    for c in _load("nemo_24_07_perf.yaml"):
        s, m = c["setup"], c["measured"]
        name = c["model"]
        if name in NEMO_DIMS:
            k = dict(NEMO_DIMS[name])
            mdl = gpt(k.pop("h"), k.pop("L"), k.pop("a"), k.pop("V"), s["seq_len"], name=name, **k)
        else:
            mdl = load_model({"LLAMA2-7B": "llama-2-7b", "LLAMA2-13B": "llama-2-13b",
                              "LLAMA2-70B": "llama-2-70b", "LLAMA3-8B": "llama-3.1-8b",
                              "LLAMA3-70B": "llama-3.1-70b"}[name])
        method = {"LoRA": "lora", "SFT": "full"}.get(c["id"].split("-")[-3], "pretrain")
        vp = s.get("vp") or 1
        family = name.split("-")[0]
        p = plan(mdl, cluster("h100-sxm", s["gpus"], inter="ib-ndr"), tp=s["tp"], pp=s["pp"],
                 cp=s["cp"], vp=vp, zero=1, mbs=s["mbs"], gbs=s["gbs"], seq=s["seq_len"],
                 precision="fp8-mixed", method=method, framework="megatron-core",
                 lora=NEMO_LORA if method == "lora" else None,
                 dropout=NEMO_DROPOUT.get(family, 0.0), fused_loss=family in NEMO_FUSED_LOSS,
                 recompute="selective" if name in NEMO_SELECTIVE else "none", **NEMO_FP8)
        if method != "pretrain":
            p = p.model_copy(update={"recipe": p.recipe.model_copy(update={"doc_len": NEMO_SQUAD_DOC_LEN})})
        out.append(Case(c["id"], "nemo-24.07", p, STACK, "tokens_per_s_per_gpu",
                        m["tokens_per_s_per_gpu"]))
    return out


#: our own measurements (bench/time_cuda.py on one H200: torch 2.11, transformers 5.17, verify's
#: StepRunner: the plain Hugging Face model, SDPA, torch AdamW, one GPU)
H200_STEPS = Path(__file__).resolve().parent / "results" / "time_cuda_h200.json"


def h200_cases() -> list[Case]:
    """Single-GPU hf training steps measured on an H200. verify's StepRunner runs no Trainer loop,
    so the hf profile's host step (logging, LR scheduler, data hand-off) is added to the measured
    step: the row compares the GPU work the model prices."""
    if not H200_STEPS.exists():
        return []
    out = []
    for r in json.loads(H200_STEPS.read_text())["step"]:
        if "measured_step_s" not in r:
            continue
        p = build_plan(PlanInputs(gpu="h200", framework="hf", **r["inputs"]))
        host = stack_profile("hf", p.cluster.gpu).host_step_s
        cid = "h200-hf-" + "-".join(r["name"].lower().replace(".", "").split())
        out.append(Case(cid, "trainledger-h200", p, TimeOptions(), "step_time_s", r["measured_step_s"] + host,
                        note="measured without a Trainer loop; + the profile's host step"))
    return out


def all_cases() -> list[Case]:
    return (megatron_cases() + korthikanti_cases() + mosaic_cases() + reported_cases()
            + torchtitan_cases() + nemo_cases() + h200_cases())


def predict(case: Case) -> tuple[float, float]:
    """(predicted, error) in the case's metric; error = |rate_pred / rate_meas - 1|."""
    comp = estimate_compute(case.plan, case.opts)
    p = case.plan
    if case.metric == "tokens_per_s_per_gpu":
        pred = comp.tokens_per_s_per_gpu
        return pred, abs(pred / case.measured - 1)
    if case.metric == "model_tflops":
        pred = comp.model_flop_per_s_per_gpu / 1e12
        return pred, abs(pred / case.measured - 1)
    if case.metric == "tflops_96":
        m = p.model
        f = narayanan_flops_per_iteration(p.global_batch, p.recipe.seq_len, m.num_layers,
                                          m.hidden_size, m.vocab_size)
        pred = f / comp.step_time_s / p.cluster.world_size / 1e12
        return pred, abs(pred / case.measured - 1)
    if case.metric == "gpu_hours":
        pred = estimate_time(p, comp).gpu_hours
        if case.source == "llama2":  # reported hours include downtime (Llama 3 paper §3.3.4: >90%)
            pred /= EFFECTIVE_TRAINING_TIME
        return pred, abs(case.measured / pred - 1)
    pred = comp.step_time_s
    return pred, abs(case.measured / pred - 1)


def evaluate_all() -> list[dict[str, Any]]:
    rows = []
    for c in all_cases():
        pred, err = predict(c)
        rate_ratio = (pred / c.measured) if c.metric in ("tokens_per_s_per_gpu", "model_tflops",
                                                          "tflops_96") else (c.measured / pred)
        mem = None
        if c.memory_gib:
            est = estimate_memory(c.plan, MemoryOptions(suggestions=False), suggest=False)
            mem = (c.memory_gib, est.peak_reserved_bytes / 2**30)
        rows.append({"id": c.id, "source": c.source, "stack": c.stack, "family": c.family,
                     "metric": c.metric, "measured": c.measured, "predicted": pred,
                     "abs_error": err, "signed_error": rate_ratio - 1, "secondary": c.secondary,
                     "memory_gib": mem, "gpus": c.plan.cluster.world_size})
    return rows


def quantile(xs: list[float], q: float) -> float:
    """The q-quantile of xs, linearly interpolated between order statistics (NaN when empty)."""
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    primary = [r for r in rows if not r["secondary"]]
    errs = [r["abs_error"] for r in primary]
    by_src: dict[str, list[float]] = {}
    by_stack: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_src.setdefault(r["source"], []).append(r["abs_error"])
        if not r["secondary"]:
            by_stack.setdefault(f"{r['stack']}/{r['family']}", []).append(r)
    stacks = {}
    for k, rs in sorted(by_stack.items()):
        e = [r["abs_error"] for r in rs]
        sg = [r["signed_error"] for r in rs]
        stacks[k] = {"n": len(rs), "median": statistics.median(e), "max": max(e),
                     "bias": statistics.median(sg), "p10": quantile(sg, 0.1), "p90": quantile(sg, 0.9)}
    return {"cases": len(errs), "median_abs_error": statistics.median(errs),
            "mean_abs_error": statistics.fmean(errs), "max_abs_error": max(errs),
            "over_20pct": sum(e > 0.20 for e in errs),
            "by_source": {k: {"n": len(v), "median": statistics.median(v), "max": max(v)}
                          for k, v in by_src.items()},
            "by_stack": stacks}


def write_intervals(summary: dict[str, Any], rows: list[dict[str, Any]]) -> Path:
    """catalog/efficiency/intervals.yaml from this run's residuals (see estimate/time/intervals.py)."""
    from trainledger.estimate.time import intervals

    sg = [r["signed_error"] for r in rows if not r["secondary"]]
    gpus_max: dict[str, int] = {}
    for r in rows:
        if not r["secondary"]:
            key = f"{r['stack']}/{r['family']}"
            gpus_max[key] = max(gpus_max.get(key, 0), int(r["gpus"]))
    data = {"source": "bench/time_accuracy.py --write-intervals: p10/p90 of the signed rate error "
                      "(pred/meas - 1) of the primary cases, per stack/GPU family",
            "pooled": {"n": len(sg), "p10": round(quantile(sg, 0.1), 4), "p90": round(quantile(sg, 0.9), 4),
                       "median": round(statistics.median(sg), 4)},
            "stacks": {k: {"n": v["n"], "p10": round(v["p10"], 4), "p90": round(v["p90"], 4),
                           "median": round(v["bias"], 4), "gpus_max": gpus_max[k]}
                       for k, v in summary["by_stack"].items()}}
    old = intervals._table()
    if old.get("calibrated"):
        data["calibrated"] = old["calibrated"]
    path = intervals._path()
    path.write_text("# generated; do not edit by hand\n" + yaml.safe_dump(data, sort_keys=True),
                    encoding="utf-8")
    return path


def _source_screen():
    """bench/source_screen.py, loaded by path as this file is (tests load it the same way)."""
    import importlib.util

    name = "trainledger_bench_source_screen"
    if name not in sys.modules:
        path = Path(__file__).resolve().parent / "source_screen.py"
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod  # dataclasses resolve their module by name
        spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return sys.modules[name]


def source_screen(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The model-free consistency screen of the measured rows (bench/source_screen.py): evidence
    printed beside the summary; it reads only the cases' measured figures and plans, and changes
    neither the primary set nor any figure of ``summarize``."""
    ss = _source_screen()
    result = ss.screen(ss.rows_of_cases(all_cases(), GT))
    over = [r["id"] for r in rows if not r["secondary"] and r["abs_error"] > 0.20]
    return ss.report(result, over)


def main(argv: list[str]) -> int:
    rows = evaluate_all()
    summary = summarize(rows)
    if "--write-intervals" in argv:
        print(f"wrote {write_intervals(summary, rows)}")
    if "--json" in argv:
        print(json.dumps({"rows": rows, "summary": summary, "source_screen": source_screen(rows)},
                         indent=2))
        return 0
    show = rows if "--all" in argv else [r for r in rows if not r["secondary"]] + [
        r for r in rows if r["secondary"]]
    print(f"{'case':52s} {'stack':18s} {'metric':20s} {'measured':>10s} {'predicted':>10s} {'error':>7s}"
          "  memory GiB measured/predicted reserved (where stated)")
    for r in show:
        flag = " (secondary)" if r["secondary"] else ""
        mem = f"  mem {r['memory_gib'][0]:.1f}/{r['memory_gib'][1]:.1f}" if r["memory_gib"] else ""
        print(f"{r['id'][:52]:52s} {r['stack']:18s} {r['metric']:20s} {r['measured']:10.2f} "
              f"{r['predicted']:10.2f} {100 * r['signed_error']:+6.1f}%{flag}{mem}")
    print("\nby source (all cases):")
    for k, v in summary["by_source"].items():
        print(f"  {k:18s} n={v['n']:3d}  median {100 * v['median']:5.1f}%  max {100 * v['max']:5.1f}%")
    print("\nby stack and GPU family (primary cases; bias = median signed error of the rate, "
          "+ = predicted too fast; p10/p90 of the signed error):")
    print(f"  {'stack/family':28s} {'n':>4s} {'median':>7s} {'max':>7s} {'bias':>7s} {'p10':>7s} {'p90':>7s}")
    for k, v in summary["by_stack"].items():
        print(f"  {k:28s} {v['n']:4d} {100 * v['median']:6.1f}% {100 * v['max']:6.1f}% "
              f"{100 * v['bias']:+6.1f}% {100 * v['p10']:+6.1f}% {100 * v['p90']:+6.1f}%")
    print(f"\nprimary cases: {summary['cases']}  median abs error {100 * summary['median_abs_error']:.1f}%"
          f"  mean {100 * summary['mean_abs_error']:.1f}%  max {100 * summary['max_abs_error']:.1f}%"
          f"  cases > 20%: {summary['over_20pct']}")
    mem = [r["memory_gib"][1] / r["memory_gib"][0] - 1 for r in rows if r["memory_gib"]]
    if mem:
        print(f"memory (rows that state it, predicted reserved vs measured): n={len(mem)}  median abs error "
              f"{100 * statistics.median(abs(x) for x in mem):.1f}%  range {100 * min(mem):+.1f}% .. {100 * max(mem):+.1f}%")
    print("targets: median <= 8%, no case > 20%")
    _source_screen().print_report(source_screen(rows), {r["id"]: r["signed_error"] for r in rows})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
