"""What a new user hits in the first hour: each test is a path that was wrong before its fix.

Expected values come from the command's own documented contract (its --help or docstring), from the
flag the user typed, or from public facts — never from the output being tested.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from trainledger.cli import main


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def _help_of(args: list[str], flag: str) -> str:
    """The help text of one option, whitespace-joined (click wraps it over lines)."""
    r = run(*args, "--help")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.strip().startswith(flag + " "))
    out = [lines[start]]
    for ln in lines[start + 1:]:
        if ln.strip().startswith("-"):
            break
        out.append(ln)
    return " ".join(" ".join(out).split())


# -- plan --help states the defaults plan really uses ----------------------------------------------

def test_plan_help_states_the_example_jobs_defaults():
    # `plan`'s docstring: the example job is "20B tokens, 7-day deadline, up to 64 GPUs, cheapest
    # first"; --help listed the Job field defaults instead ([time], [1024], no token budget)
    assert "[cost" in _help_of(["plan"], "--rank-by")
    assert "[time]" not in _help_of(["plan"], "--rank-by")
    assert "[64" in _help_of(["plan"], "--max-gpus")
    assert "[7" in _help_of(["plan"], "--deadline-days")
    assert "20" in _help_of(["plan"], "--tokens")
    # global batch: 256 sequences in the docstring, whatever the --seq-len ("~1M tokens" only at 4096)
    gb = _help_of(["plan"], "--global-batch")
    assert "[256" in gb and "1M tokens" not in gb


def test_plan_help_default_is_what_a_bare_plan_uses():
    # the contract the help now states: a flag not given keeps the example job's value
    r = run("plan", "--top", "1", "--json")
    assert r.exit_code == 0, r.output
    job = json.loads(r.output)["job"]
    assert job["rank_by"] == "cost" and job["max_gpus"] == 64 and job["deadline_days"] == 7


def test_estimate_help_keeps_the_fields_own_defaults():
    # estimate has no example job: its --tokens has no default and --seq-len is the field's 4096
    assert "example job" not in _help_of(["estimate"], "--seq-len")
    assert "[4096]" in _help_of(["estimate"], "--seq-len")


# -- a flag the plan never reads is said, not silently dropped -------------------------------------

@pytest.mark.parametrize("flags, flag", [
    (["--quantization", "awq"], "--quantization"),              # weight quantization: serving only
    (["--kv-cache-dtype", "fp8"], "--kv-cache-dtype"),
    (["--generate-len", "256"], "--generate-len"),
    (["--max-num-seqs", "8"], "--max-num-seqs"),
    (["--recompute-layers", "4"], "--recompute-layers"),        # without --recompute full
])
def test_a_flag_a_training_estimate_ignores_is_warned(flags, flag):
    r = run("estimate", "--model", "llama-3.1-8b", "--no-ledger", *flags)
    assert r.exit_code == 0, r.output
    assert f"warning: {flag} is ignored" in r.output


def test_qlora_quantization_flag_is_warned_with_the_reason():
    # QLoRA's base is NF4 (Dettmers et al. 2023): --quantization fp8 on a qlora plan changes nothing
    r = run("estimate", "--method", "qlora", "--quantization", "fp8", "--no-ledger")
    assert r.exit_code == 0, r.output
    assert "warning: --quantization is ignored" in r.output and "NF4" in r.output


def test_recompute_on_an_inference_estimate_is_warned():
    r = run("estimate", "--method", "inference", "--recompute", "full", "--no-ledger")
    assert r.exit_code == 0, r.output
    assert "warning: --recompute is ignored" in r.output


def test_flags_that_are_read_are_not_warned():
    for args in (["--method", "inference", "--quantization", "awq", "--generate-len", "64"],
                 ["--recompute", "full", "--recompute-layers", "4"],
                 ["--method", "lora", "--lora-rank", "64"]):
        r = run("estimate", "--no-ledger", *args)
        assert r.exit_code == 0, r.output
        assert "warning:" not in r.output, (args, r.output)


def test_ignored_flags_change_nothing_they_are_warned_about():
    # the warning is honest only if the flag really has no effect: same figures with and without it
    def est(*extra):
        r = run("estimate", "--no-ledger", "--json", "--model", "llama-3.1-8b", *extra)
        assert r.exit_code == 0, r.output
        d = json.loads(r.output[r.output.index("{"):])
        return d["memory"]["device_total_bytes"], d["compute"]["step_time_s"]

    assert est() == est("--quantization", "awq", "--kv-cache-dtype", "fp8", "--generate-len", "512")
    assert est("--recompute", "selective") == est("--recompute", "selective", "--recompute-layers", "3")


# -- errors name the flag the user typed ----------------------------------------------------------

@pytest.mark.parametrize("args, flag", [
    (["estimate", "--gpus", "0"], "--gpus"),
    (["estimate", "--seq-len", "0"], "--seq-len"),
    (["check", "--micro-batch", "0"], "--micro-batch"),
    (["estimate", "--headroom", "1.5"], "--headroom"),
    (["estimate", "--price-per-gpu-hour", "-1"], "--price-per-gpu-hour"),
    (["estimate", "--electricity-price", "-1"], "--electricity-price"),  # field electricity_usd_per_kwh
    (["serve-plan", "--requests-per-s", "0"], "--requests-per-s"),
])
def test_a_bad_flag_value_names_the_flag(args, flag):
    r = run(*args)
    assert r.exit_code == 2, r.output
    assert r.output.startswith(f"error: {flag}: "), r.output
    assert "Traceback" not in r.output


def test_a_bad_plan_file_key_still_names_the_file_key(tmp_path):
    # a key from a plan file is not a flag: the message keeps the key name
    f = tmp_path / "p.yaml"
    f.write_text("gpus: 0\n")
    r = run("estimate", "--plan", str(f))
    assert r.exit_code == 2
    assert "gpus: Input should be greater than 0" in r.output and "--gpus" not in r.output


# -- serve-plan says what it assumed ---------------------------------------------------------------

def test_serve_plan_does_not_call_an_unpriced_plan_cheapest():
    # serve-plan ranks by cloud $/h, then GPU count: a first plan without a price is the fewest GPUs
    r = run("serve-plan", "--model", "llama-3.1-8b", "--requests-per-s", "1", "--generate-len", "64",
            "--gpu-types", "a100-pcie-80gb", "--tps", "1")
    assert r.exit_code == 0, r.output
    assert "no cloud price" in run("prices", "a100-pcie-80gb").output  # the catalog has no price for it
    assert "cheapest:" not in r.output and "fewest GPUs" in r.output


def test_serve_plan_without_generate_len_says_one_output_token():
    r = run("serve-plan", "--model", "llama-3.1-8b", "--requests-per-s", "1", "--gpu-types", "h100-sxm",
            "--tps", "1")
    assert r.exit_code == 0, r.output
    assert "no --generate-len" in r.output
    r = run("serve-plan", "--model", "llama-3.1-8b", "--requests-per-s", "1", "--gpu-types", "h100-sxm",
            "--tps", "1", "--generate-len", "128")
    assert "no --generate-len" not in r.output


# -- one run, one checkpoint interval: the output says when two sections assume different ones ------

def test_checkpoint_and_goodput_intervals_are_reconciled_in_the_text():
    # without --checkpoint-interval the checkpoint line assumes its default (3600 s, its --help) while
    # goodput uses the Daly optimum: the text must say they differ, and --checkpoint-interval sets both
    base = ["estimate", "--no-ledger", "--model", "llama-3.1-8b", "--method", "lora", "--tokens", "1B"]
    assert "[3600]" in _help_of(["estimate"], "--checkpoint-interval")
    r = run(*base)
    assert r.exit_code == 0, r.output
    assert "one per 60.0 min" in r.output and "Daly optimum" in r.output
    assert "note: the checkpoint line assumes one per 60.0 min" in r.output
    r = run(*base, "--checkpoint-interval", "3600")
    assert "note: the checkpoint line assumes" not in r.output
    assert "at a checkpoint every 60.0 min" in r.output


# -- export: the formats the docstring names are the formats --to takes; -o as in `report` ----------

def test_export_help_names_every_format():
    from trainledger.runconfig import EXPORT_FORMATS, SERVING_EXPORT_FORMATS

    r = run("export", "--help")
    doc = " ".join(r.output.split("Options:")[0].split())
    missing = [f for f in EXPORT_FORMATS + SERVING_EXPORT_FORMATS if f not in doc]
    assert not missing, missing


def test_export_takes_dash_o_like_report(tmp_path):
    r = run("export", "--to", "deepspeed", "--gpus", "8", "--zero", "3", "-o", str(tmp_path))
    assert r.exit_code == 0, r.output
    cfg = json.loads((tmp_path / "deepspeed.json").read_text())
    assert cfg["zero_optimization"]["stage"] == 3 and cfg["train_micro_batch_size_per_gpu"] == 1


# -- plan: when nothing fits, the text shows why (every kind of rejection), with the flags as typed ---

def test_plan_that_misses_the_deadline_shows_the_deadline_in_text():
    # 405B on 15T tokens: 6·N·T = 6 · 405e9 · 15e12 = 3.6e25 FLOP; 16,384 H100 at the 989 TFLOP/s dense
    # bf16 peak (NVIDIA H100 datasheet) need 3.6e25 / (16384 · 989e12) s = 26 days even at 100% MFU,
    # so the example job's 7-day deadline rejects every count. The text listed only the first
    # rejection per GPU ("megatron-core: needs ... over 1"): every reason shares the stack prefix.
    r = run("plan", "--model", "llama-3.1-405b", "--method", "pretrain", "--seq-len", "8192",
            "--global-batch", "2048", "--tokens", "15T", "--max-gpus", "16384", "--gpu", "h100-sxm",
            "--framework", "megatron-core")
    assert r.exit_code == 1, r.output
    rejected = r.output.split("\nrejected (")[1]
    assert "misses the 7-day deadline" in rejected
    assert "h100-sxm x 16384" in rejected             # the nearest miss: the most GPUs tried
    assert "--deadline-days" in rejected              # the deadline was the example job's, not the user's
    head = r.output.splitlines()[0]
    assert "--gpu," in head and "--gpus" not in head  # the user typed --gpu


def test_rejected_kinds_keep_one_per_kind_and_the_nearest_miss():
    from trainledger.cli.plan_cmd import _rejected_kinds

    rej = [{"gpu": "a", "gpus": n, "framework": "hf", "reason": f"hf: needs at least {m} GiB of states"}
           for n, m in ((1, 400), (2, 200), (4, 100))]
    rej += [{"gpu": "a", "gpus": n, "framework": "hf", "reason": f"hf: misses the 7-day deadline: {d} days"}
            for n, d in ((8, 20.5), (16, 10.2))]
    out = _rejected_kinds(rej)
    assert [(r["gpus"], r["reason"][:15]) for r in out] == [(4, "hf: needs at le"), (16, "hf: misses the ")]


# -- an instruct variant of a bundled preset: the error names the preset to use --------------------

@pytest.mark.parametrize("hub_id, preset", [
    # Meta's and Qwen's instruct releases keep the base config.json (same shapes, same vocabulary)
    ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"),
    ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b"),
])
def test_uncached_instruct_variant_points_to_its_base_preset(monkeypatch, tmp_path, hub_id, preset):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))  # an empty cache
    r = run("estimate", "--no-ledger", "--model", hub_id)
    assert r.exit_code == 2
    assert f"--model {preset}" in r.output
    assert run("estimate", "--no-ledger", "--model", preset).exit_code == 0  # and that hint works


def test_uncached_model_without_a_base_preset_gets_no_hint(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    r = run("estimate", "--no-ledger", "--model", "meta-llama/Meta-Llama-3-8B")
    assert r.exit_code == 2 and "Its base" not in r.output


# -- a misspelt link names the flag it came from ----------------------------------------------------

@pytest.mark.parametrize("args, flag, right", [
    (["--intra", "nvlnk4"], "--intra", "nvlink4"),
    (["--network", "ib-hdrr", "--gpus", "16"], "--network", "ib-hdr"),
])
def test_unknown_link_names_its_flag_and_the_close_name(args, flag, right):
    r = run("estimate", "--no-ledger", *args)
    assert r.exit_code == 2
    assert r.output.startswith(f"error: {flag}: unknown network") and right in r.output


# -- ledger show: an estimate record reads as one ----------------------------------------------------

def test_ledger_show_of_an_estimate_summarises_it(tmp_path):
    db = str(tmp_path / "l.db")
    r = run("estimate", "--model", "llama-3.1-8b", "--method", "lora", "--ledger", db, "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    want = f"{d['memory']['device_total_bytes'] / 2**30:.2f} GiB"  # the figure estimate printed
    shown = run("ledger", "show", "1", "--ledger", db)
    assert shown.exit_code == 0, shown.output
    first, last = shown.output.splitlines()[0], shown.output.splitlines()[-1]
    assert not first.rstrip().endswith(","), first   # was "... at <time>, " with nothing after the comma
    assert want in last and "fits" in last and "(see --json)" not in last


# -- layouts that cannot run are errors, and the header shows every degree ---------------------------

def test_more_virtual_stages_than_layers_is_an_error():
    # Llama-3.1-8B has 32 decoder layers (its config.json num_hidden_layers); pp=4 × vp=16 = 64 virtual
    # stages would hold half a layer each: Megatron-Core cannot build that model
    r = run("estimate", "--no-ledger", "--framework", "megatron-core", "--gpus", "4", "--pp", "4", "--vp", "16")
    assert r.exit_code == 2 and "32 layers" in r.output and "--vp 8" in r.output
    ok = run("estimate", "--no-ledger", "--framework", "megatron-core", "--gpus", "4", "--pp", "4", "--vp", "8")
    assert ok.exit_code == 0, ok.output
    assert "vp=8" in ok.output.splitlines()[0]  # the header showed pp=4 only


def test_mla_latent_cache_on_a_model_without_mla_is_warned():
    # Llama 3.1 uses grouped-query attention (8 KV heads), not DeepSeek's multi-head latent attention
    r = run("estimate", "--no-ledger", "--method", "inference", "--mla-latent-cache")
    assert r.exit_code == 0 and "warning: --mla-latent-cache is ignored" in r.output
    r = run("estimate", "--no-ledger", "--method", "inference", "--mla-latent-cache", "--model", "deepseek-v3",
            "--gpu", "h200", "--gpus", "8", "--tp", "8")
    assert r.exit_code == 0 and "warning:" not in r.output


# -- plan files: check takes one as export does; a misspelt key gets the close name ------------------

def test_check_takes_the_plan_file_as_an_argument_like_export(tmp_path):
    f = tmp_path / "plan.toml"
    f.write_text('model = "llama-3.1-8b"\ngpus = 8\nzero = 3\n')
    as_arg, as_flag = run("check", str(f)), run("check", "--plan", str(f))
    assert as_arg.exit_code == as_flag.exit_code == 0, as_arg.output
    assert as_arg.output == as_flag.output
    assert run("check", str(f), "--plan", str(f)).exit_code == 2


def test_plan_file_typo_suggests_the_key(tmp_path):
    f = tmp_path / "plan.yaml"
    f.write_text("model: llama-3.1-8b\nseqlen: 2048\n")
    r = run("estimate", "--plan", str(f))
    assert r.exit_code == 2 and "seqlen: Did you mean: seq_len?" in r.output


def test_plan_value_errors_name_the_flag():
    r = run("plan", "--tokens", "0")
    assert r.exit_code == 2 and r.output.startswith("error: --tokens: "), r.output
    r = run("plan", "--deadline-days", "-1")
    assert r.exit_code == 2 and r.output.startswith("error: --deadline-days: "), r.output


# -- an exported config predicts what re-reading that config estimates ------------------------------

@pytest.mark.parametrize("fmt, fname", [("accelerate", "accelerate_config.yaml"),
                                        ("trainer-args", "training_args.yaml")])
@pytest.mark.parametrize("zero", ["2", "3"])
def test_export_header_agrees_with_estimate_from_the_exported_file(tmp_path, fmt, fname, zero):
    # an hf plan with ZeRO-3 is written as an FSDP2 config (fsdp_version: 2) and with ZeRO-2 as a
    # DeepSpeed one; the header predicted the hf plan while `estimate --from` the file modelled the
    # stack the file runs (27.6 vs 30.4 GiB on the device for 8B, zero 3, mb 2, seq 2048, recompute full)
    args = ["--model", "llama-3.1-8b", "--gpus", "8", "--zero", zero, "--micro-batch", "2", "--grad-accum", "4",
            "--seq-len", "2048", "--recompute", "full"]
    r = run("export", "--to", fmt, *args, "--out", str(tmp_path))
    assert r.exit_code == 0, r.output
    text = (tmp_path / fname).read_text()
    header = next(ln for ln in text.splitlines() if ln.startswith("# Predicted peak memory: "))
    predicted = float(header.split(": ")[1].split(" GiB")[0])
    again = run("estimate", "--from", str(tmp_path / fname), "--model", "llama-3.1-8b", "--gpus", "8",
                "--seq-len", "2048", "--json", "--no-ledger")
    assert again.exit_code == 0, again.output
    d = json.loads(again.output[again.output.index("{"):])
    assert d["plan"]["zero"] == int(zero)
    assert predicted == pytest.approx(d["memory"]["peak_allocated_bytes"] / 2**30, abs=0.006)


def test_serve_plan_tp_narrows_the_search_and_gpus_is_warned():
    # --tp was silently ignored (the search always tried 1,2,4,8) and so was --gpus
    r = run("serve-plan", "--model", "llama-3.1-8b", "--requests-per-s", "1", "--generate-len", "64",
            "--gpu", "h100-sxm", "--tp", "2", "--gpus", "2", "--json")
    assert r.exit_code == 0, r.output
    assert "warning: --gpus is ignored" in r.output
    d = json.loads(r.output[r.output.index("{"):])
    assert {c["tp"] for c in d["candidates"] + d["rejected"]} == {2}
    assert run("serve-plan", "--requests-per-s", "1", "--tp", "2", "--tps", "4").exit_code == 2


def test_report_compare_gpus_typo_is_an_error_not_a_report_row(tmp_path):
    r = run("report", "--compare-gpus", "h100-sxm,h10", "-o", str(tmp_path / "r.md"))
    assert r.exit_code == 2 and "--compare-gpus" in r.output and "h100-sxm" in r.output
    assert not (tmp_path / "r.md").exists()


def test_many_bad_flags_name_each_flag_and_keep_the_count():
    r = run("estimate", "--gpus", "0", "--seq-len", "0", "--micro-batch", "0", "--grad-accum", "0", "--tp", "0",
            "--pp", "0", "--cp", "0")
    assert r.exit_code == 2
    assert r.output.startswith("error: --gpus: ") and "--tp: " in r.output
    assert r.output.rstrip().endswith("; and 2 more") and "plan: and" not in r.output


# -- --corpus: the header names what was typed; the dataset itself gets a pointed error -------------

def _stats(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"text": "word " * (20 * (i % 7 + 1))}) + "\n" for i in range(50)))
    r = run("corpus", str(data), "-q", "--json")
    assert r.exit_code == 0, r.output
    stats = tmp_path / "stats.json"
    stats.write_text(r.output[r.output.index("{"):])
    return data, stats


def test_plan_header_names_corpus_not_the_fields_it_derived(tmp_path):
    _, stats = _stats(tmp_path)
    r = run("plan", "--corpus", str(stats), "--epochs", "2", "--top", "1")
    head = r.output.splitlines()[0]
    assert "--corpus" in head and "--epochs" in head
    assert "--seq-len" not in head and "--tokens" not in head   # the user typed neither


def test_corpus_flag_given_the_dataset_says_to_run_corpus_first(tmp_path):
    data, _ = _stats(tmp_path)
    r = run("estimate", "--no-ledger", "--corpus", str(data))
    assert r.exit_code == 2 and "trainledger corpus" in r.output and "--json" in r.output


# -- calibrate after `ledger import`: the error names the environment that has the measurement -------

def test_calibrate_after_import_names_the_imported_environment(tmp_path):
    state = tmp_path / "trainer_state.json"
    logs = [{"step": 10 * i, "loss": 2.0, "learning_rate": 1e-5, "epoch": 0.01 * i} for i in range(1, 20)]
    logs.append({"step": 190, "train_runtime": 380.0, "train_steps_per_second": 0.5, "train_loss": 1.9})
    state.write_text(json.dumps({"log_history": logs, "global_step": 190, "max_steps": 190}))
    db = str(tmp_path / "l.db")
    r = run("ledger", "import", str(state), "--ledger", db, "--model", "llama-3.1-8b", "--method", "lora",
            "--gpus", "8", "--json")
    assert r.exit_code == 0, r.output
    env = json.loads(r.output[r.output.index("{"):])["env_id"]
    r = run("calibrate", "--ledger", db)          # this machine is not the logged run's environment
    assert r.exit_code == 2 and f"calibrate --env {env}" in r.output
    assert run("calibrate", "--ledger", db, "--env", env).exit_code == 0


def test_prices_of_an_unknown_gpu_is_a_typo_error_not_a_missing_price():
    r = run("prices", "h10O")
    assert r.exit_code == 2 and "unknown gpu" in r.output and "no cloud price" not in r.output
    r = run("prices", "a100-pcie-80gb")   # a catalog GPU the price catalog does not price
    assert r.exit_code == 0 and "no cloud price" in r.output


@pytest.mark.parametrize("framework", ["hf", "deepspeed", "megatron-deepspeed"])
def test_offload_params_needs_zero3_under_deepspeed_semantics(framework):
    """DeepSpeed: zero_optimization.offload_param is valid only with stage 3 (DeepSpeed config docs)."""
    from trainledger.errors import LayoutError
    from trainledger.load.plan import PlanInputs, build_plan

    with pytest.raises(LayoutError) as exc:
        build_plan(PlanInputs(model="llama-3.1-8b", gpus=8, zero=2, offload="params", framework=framework))
    assert exc.value.field == "offload" and "--zero 3" in str(exc.value)
    build_plan(PlanInputs(model="llama-3.1-8b", gpus=8, zero=3, offload="params", framework=framework))
    build_plan(PlanInputs(model="llama-3.1-8b", gpus=8, zero=2, offload="optimizer", framework=framework))


def test_training_only_flags_change_no_inference_figure():
    """--optimizer, --grad-accum, --dropout and --offload optimizer describe training: an inference
    estimate is the same without them (they changed its checkpoint, host and step figures), and each
    is warned about."""
    def est(*extra):
        r = run("estimate", "--no-ledger", "--json", "--method", "inference", "--model", "llama-3.1-8b",
                "--gpus", "8", "--zero", "3", *extra)
        assert r.exit_code == 0, r.output
        d = json.loads(r.output[r.output.index("{"):])
        return d, r.output

    base, _ = est()
    for extra, flag in ((("--optimizer", "adamw-8bit"), "--optimizer"), (("--grad-accum", "4"), "--grad-accum"),
                        (("--dropout", "0.1"), "--dropout"), (("--offload", "optimizer"), "--offload")):
        d, out = est(*extra)
        assert f"warning: {flag} is ignored" in out, (extra, out[:300])
        for section in ("memory", "compute", "checkpoint", "host"):
            a = {k: v for k, v in d[section].items() if k != "notes"}
            b = {k: v for k, v in base[section].items() if k != "notes"}
            assert a == b, (extra, section)



def test_corpus_stats_at_another_seq_len_are_refused_without_tokens(tmp_path):
    """The padded token count belongs to the corpus's own sequence length (padding waste changes with
    it): a different --seq-len must re-run the stats or state --tokens."""
    _, stats = _stats(tmp_path)
    own = json.loads(stats.read_text())["seq_len"]
    other = own * 2
    r = run("estimate", "--no-ledger", "--corpus", str(stats), "--seq-len", str(other))
    assert r.exit_code == 2, r.output
    assert f"seq_len {own}" in r.output and f"--seq-len {other}" in r.output
    assert run("estimate", "--no-ledger", "--corpus", str(stats), "--seq-len", str(other),
               "--tokens", "1e9").exit_code == 0
    assert run("estimate", "--no-ledger", "--corpus", str(stats), "--seq-len", str(own)).exit_code == 0
