"""Issue 18: every answer honest — defaults, impossible hardware, labels, error lines (CLI level)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from trainledger.cli import main
from trainledger.load.plan import PlanInputs, build_plan


def run(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(main, list(args))
    return r.exit_code, r.output


def est_json(*args: str) -> dict:
    code, out = run("estimate", *args, "--json")
    assert code == 0, out
    return json.loads(out)


# -- 1. defaults that match what users run --------------------------------------------------------

def test_lora_default_keeps_the_checkpoint_dtype_base_and_fp32_adapters():
    """peft on a bf16 checkpoint: the frozen base is bf16 (2 bytes/param), not fp32 plus autocast copies."""
    d = est_json("-m", "qwen2.5-7b", "--gpu", "rtx-4090", "--seq-len", "2048", "--method", "lora")
    assert d["plan"]["precision"] == "bf16"
    br = d["memory"]["breakdown"]
    n = d["plan"]["params"]
    assert br["weights"] == pytest.approx(2 * n, rel=0.02)  # bf16 base + fp32 adapters (< 1%)
    assert br.get("autocast_weight_copies", 0) == 0
    assert "peft" in d["plan"]["precision_policy"] and "default for lora" in d["plan"]["precision_policy"]


def test_todays_lora_behaviour_is_reachable_by_flag():
    d = est_json("-m", "qwen2.5-7b", "--gpu", "rtx-4090", "--seq-len", "2048", "--method", "lora",
                 "--precision", "bf16-mixed")
    assert d["memory"]["breakdown"]["weights"] == pytest.approx(4 * d["plan"]["params"], rel=0.02)
    assert "chosen with --precision" in d["plan"]["precision_policy"]


def test_every_estimate_states_the_precision_policy_in_text():
    code, out = run("estimate", "-m", "qwen2.5-0.5b", "--method", "inference")
    assert code == 0, out
    line = out.splitlines()[1]
    assert line.startswith("precision bf16 (weights bf16") and "default for inference" in line


@pytest.mark.parametrize("method,want", [("pretrain", "bf16-mixed"), ("full", "bf16-mixed"),
                                         ("lora", "fp16"), ("qlora", "fp16"), ("inference", "fp16")])
def test_method_default_follows_the_checkpoint_dtype(method, want):
    """llama-2-7b's checkpoint is fp16: peft/inference keep it, training from fp32 weights autocasts."""
    plan = build_plan(PlanInputs(model="llama-2-7b", method=method))
    assert plan.recipe.precision == want


# -- 3. impossible hardware ------------------------------------------------------------------------

@pytest.mark.parametrize("gpu", ["v100-sxm2-32gb", "t4"])
def test_bf16_on_gpus_without_bf16_is_an_error(gpu):
    code, out = run("estimate", "--gpu", gpu, "--precision", "bf16-mixed")
    assert code != 0 and out.startswith("error:") and "no bf16 tensor cores" in out
    assert "--precision fp16-mixed" in out


def test_default_on_v100_falls_back_to_fp16_visibly():
    d = est_json("--gpu", "v100-sxm2-32gb", "-m", "qwen2.5-0.5b")
    assert d["plan"]["precision"] == "fp16-mixed"
    assert "no bf16 tensor cores" in d["plan"]["precision_policy"]


@pytest.mark.parametrize("gpu", ["a100-sxm-80gb", "v100-sxm2-32gb"])
def test_fp8_without_fp8_tensor_cores_is_an_error(gpu):
    code, out = run("estimate", "--gpu", gpu, "--precision", "fp8-mixed")
    assert code != 0 and "no fp8 tensor cores" in out


def test_fp8_on_hopper_is_accepted():
    from trainledger.spec.precision import default_precision

    assert default_precision("full", None, None)[0] == "bf16-mixed"
    code, out = run("estimate", "--gpu", "h100-sxm", "--precision", "fp8-mixed")
    assert code == 0, out


def test_more_gpus_per_node_than_the_nvlink_domain_is_an_error():
    code, out = run("estimate", "--gpus", "16", "--gpus-per-node", "16")
    assert code != 0 and "at most 8 GPUs in one NVLink domain" in out and len(out.strip().splitlines()) == 1


def test_absurd_token_budget_is_an_error():
    code, out = run("estimate", "--tokens", "1e30")
    assert code != 0 and out.startswith("error:") and "tokens" in out


def test_gpus_table_shows_the_fp16_rate():
    code, out = run("gpus")
    head = out.splitlines()[0].split()
    row = next(ln for ln in out.splitlines() if ln.startswith("v100-sxm2-32gb")).split()
    assert "fp16" in head
    # columns after the two-word memory "32 GB": the fp16 column holds the datasheet's 125
    assert "125" in row


def test_h100_nvl_pair_uses_its_nvlink_bridge():
    plan = build_plan(PlanInputs(gpu="h100-nvl", gpus=2, model="qwen2.5-0.5b"))
    assert plan.cluster.intra.kind == "nvlink" and plan.cluster.intra.bytes_per_s == 300e9
    four = build_plan(PlanInputs(gpu="h100-nvl", gpus=4, model="qwen2.5-0.5b"))
    assert four.cluster.intra.kind == "pcie"


# -- 4. ranking by cost with unpriced GPUs ---------------------------------------------------------

def test_rank_by_cost_never_ranks_unpriced_gpus():
    code, out = run("plan", "-m", "qwen2.5-0.5b", "--tokens", "1B", "--rank-by", "cost", "--gpu", "rtx-4090",
                    "--gpu", "h100-sxm", "--max-gpus", "16", "--json")
    assert code == 0, out
    d = json.loads(out)
    assert d["plans"] and all(p["estimate"].get("cost_usd") is not None for p in d["plans"])
    assert d["unpriced_gpus"] == ["rtx-4090"] and all(p["gpu"] == "rtx-4090" for p in d["unpriced"])
    code, text = run("plan", "-m", "qwen2.5-0.5b", "--tokens", "1B", "--rank-by", "cost", "--gpu", "rtx-4090",
                     "--max-gpus", "16")
    assert "not ranked: no price for rtx-4090" in text
    assert not any(ln.startswith("1") for ln in text.splitlines())  # no rank number given to an unpriced plan


def test_prices_for_a_gpu_without_data_says_so():
    code, out = run("prices", "b200")
    assert code == 0 and "no cloud price for 'b200'" in out


# -- 8. offline Hub ids ---------------------------------------------------------------------------

def test_offline_hub_id_says_offline_not_unknown(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))  # an empty cache
    code, out = run("estimate", "-m", "some-org/some-model-7b")
    assert code != 0 and "not in the local cache and the Hub is offline" in out
    assert "unknown model" not in out


# -- 9. error lines and labels --------------------------------------------------------------------

def test_export_into_an_unwritable_folder_is_one_error_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, out = run("export", "--out", str(blocker / "sub"), "--to", "torchrun")
    assert code != 0 and out.startswith("error:") and len(out.strip().splitlines()) == 1
    assert "Traceback" not in out


def test_global_batch_error_sentence_is_complete():
    code, out = run("estimate", "--global-batch", "3", "--gpus", "2")
    assert code != 0
    assert "choose a global batch that is a multiple of 2 (e.g. 2 or 4)" in out


def test_inference_labels():
    code, out = run("estimate", "-m", "qwen2.5-0.5b", "--method", "inference", "--tokens", "1M")
    assert code == 0, out
    head = out.splitlines()[0]
    assert "adamw" not in head and "recompute" not in head
    assert "2·N·T" in out and "6·N·T" not in out
    hours = next(ln for ln in out.splitlines() if "GPU-hours" in ln)
    assert " 0 GPU-hours" not in hours and "on 1 GPU," in hours


def test_header_without_parallel_degrees_has_no_dangling_comma():
    code, out = run("estimate", "--zero", "3", "--offload", "params")
    assert code == 0, out
    assert out.splitlines()[0].endswith("1× h100-sxm (ZeRO-3, offload params)")
