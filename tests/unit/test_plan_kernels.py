"""The plan states its kernels (``--kernels fused|unfused``) and its TP overlap (``--tp-comm-overlap``).

Both were time-model options only, so an imported config could not carry them: a torchtitan TOML with
torch.compile, AsyncTP, a Megatron-LM script with or without ``--tp-comm-overlap`` and an AutoModel
recipe with Transformer Engine layers were all priced with the stack profile's default. Now they are
``Runtime`` fields: the importers set them, the exports write them, and the time model reads them
between the profile (below) and the user's ``TimeOptions`` overrides (above).
"""

from __future__ import annotations

import json
import tomllib

import pytest
from click.testing import CliRunner

from trainledger.cli import main
from trainledger.errors import SpecError
from trainledger.estimate.options import TimeOptions
from trainledger.estimate.time import estimate_compute
from trainledger.load.plan import PlanInputs, build_plan
from trainledger.runconfig import export_plan, import_configs

#: fsdp2 on H100 with TP: unfused kernels and exposed TP collectives by its profile
TP8 = dict(model="llama-3.1-8b", gpus=8, tp=8, framework="fsdp2", zero=3, seq_len=4096)


def _step(opts: TimeOptions | None = None, **kw) -> float:
    return estimate_compute(build_plan(PlanInputs(**{**TP8, **kw})), opts).step_time_s


def test_stated_kernels_price_as_the_runtime_override_does():
    base = _step()
    fused = _step(kernels="fused")
    assert fused == _step(TimeOptions(runtime="megatron"))
    assert _step(kernels="unfused") == base == _step(TimeOptions(runtime="hf"))
    assert fused < 0.97 * base  # fewer HBM passes over the activations between the GEMMs
    # the user's override wins over what the plan states
    assert _step(TimeOptions(runtime="hf"), kernels="fused") == base


def test_stated_tp_overlap_hides_tp_collectives():
    base = _step()
    on = _step(tp_comm_overlap=True)
    assert on == _step(TimeOptions(tp_comm_overlap=True)) and on < 0.97 * base
    assert _step(tp_comm_overlap=False) == base
    # megatron-core's Hopper profile overlaps by default: a plan saying no pays the TP collectives
    mc = dict(framework="megatron-core", zero=1)
    assert _step(tp_comm_overlap=False, **mc) > 1.03 * _step(**mc)
    assert _step(TimeOptions(tp_comm_overlap=True), tp_comm_overlap=False, **mc) == _step(**mc)


def test_cli_flags_reach_the_plan_and_its_json():
    r = CliRunner().invoke(main, ["estimate", "--model", "llama-3.1-8b", "--gpus", "8", "--tp", "8",
                                  "--framework", "fsdp2", "--zero", "3", "--kernels", "fused",
                                  "--tp-comm-overlap", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert (d["plan"]["runtime"]["kernels"], d["plan"]["runtime"]["tp_comm_overlap"]) == ("fused", True)
    assert d["compute"]["stack_profile"]["stated"] == ["kernels", "tp_comm_overlap"]
    assert d["compute"]["step_time_s"] == pytest.approx(_step(kernels="fused", tp_comm_overlap=True))
    r = CliRunner().invoke(main, ["estimate", "--kernels", "inlined"])
    assert r.exit_code != 0 and "fused" in r.output


def _toml(tmp_path, text: str):
    p = tmp_path / "t.toml"
    p.write_text('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nseq_len = 4096\n' + text)
    return import_configs([p])


def test_torchtitan_compile_and_async_tp_are_read(tmp_path):
    res = _toml(tmp_path, "[parallelism]\ntensor_parallel_degree = 8\nenable_async_tensor_parallel = true\n"
                          "[compile]\nenable = true\ncomponents = [\"model\", \"loss\"]\n")
    m = res.merged()
    assert (m["kernels"], m["tp_comm_overlap"]) == ("fused", True)
    assert any("torch.compile" in n for n in res.notes)
    m = _toml(tmp_path, "[parallelism]\ntensor_parallel_degree = 8\n").merged()
    assert "kernels" not in m and "tp_comm_overlap" not in m
    # AsyncTP without TP says nothing
    assert "tp_comm_overlap" not in _toml(tmp_path, "[parallelism]\nenable_async_tensor_parallel = true\n").merged()


#: a layout torchtitan runs as planned (two FSDP ranks, embedding and head wrapped on their own)
TITAN = {**TP8, "gpus": 16, "wrap": "layers+embed+head"}


def test_torchtitan_export_writes_compile_and_async_tp_and_round_trips(tmp_path):
    inputs = PlanInputs(**TITAN, kernels="fused", tp_comm_overlap=True)
    (f,) = export_plan(inputs, "torchtitan")
    d = tomllib.loads(f.text)
    assert d["compile"]["enable"] is True and d["parallelism"]["enable_async_tensor_parallel"] is True
    p = tmp_path / f.name
    p.write_text(f.text)
    assert build_plan(PlanInputs(**import_configs([p]).merged())) == build_plan(inputs)
    (g,) = export_plan(PlanInputs(**TITAN), "torchtitan")
    assert "compile" not in tomllib.loads(g.text)
    with pytest.raises(SpecError, match="torch.compile"):  # torchtitan refuses AsyncTP without compile
        export_plan(PlanInputs(**TITAN, tp_comm_overlap=True), "torchtitan")


_SCRIPT = ("torchrun --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size 4 --sequence-parallel "
           "--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 "
           "--group-query-attention --num-query-groups 8 --swiglu --normalization RMSNorm "
           "--untie-embeddings-and-output-weights --disable-bias-linear --position-embedding-type rope "
           "--vocab-size 128256 --seq-length 4096 --micro-batch-size 1 --global-batch-size 32 --bf16 "
           "--use-distributed-optimizer")


def _script(tmp_path, text: str):
    p = tmp_path / "train.sh"
    p.write_text(text + "\n")
    return import_configs([p]).merged()


def test_megatron_lm_tp_overlap_is_off_unless_given(tmp_path):
    """Megatron-LM's --tp-comm-overlap is a store_true switch (off by default): a pretrain_gpt.py script
    without it runs its TP collectives exposed, where megatron-core's Hopper profile (NeMo's recipes)
    overlaps them. With it, the profile's own choice on Hopper: stored as the default (one form)."""
    off = _script(tmp_path, _SCRIPT)
    assert off["tp_comm_overlap"] is False
    on = _script(tmp_path, _SCRIPT + " --tp-comm-overlap")
    assert "tp_comm_overlap" not in on  # on H100 (the default GPU) the stack's own choice
    slow = estimate_compute(build_plan(PlanInputs(**off))).step_time_s
    assert slow > 1.02 * estimate_compute(build_plan(PlanInputs(**on))).step_time_s


def test_nemo_ub_tp_comm_overlap_is_read(tmp_path):
    p = tmp_path / "nemo.sh"
    p.write_text("python megatron_gpt_pretraining.py trainer.devices=8 trainer.precision=bf16 "
                 "model.tensor_model_parallel_size=4 model.sequence_parallel=true model.micro_batch_size=1 "
                 "model.global_batch_size=64 model.encoder_seq_length=4096 model.ub_tp_comm_overlap=false "
                 "--factory llama3_8b\n")
    assert import_configs([p]).merged()["tp_comm_overlap"] is False
    p.write_text(p.read_text().replace("model.ub_tp_comm_overlap=false ", ""))
    assert "tp_comm_overlap" not in import_configs([p]).merged()  # NeMo: the recipe's own choice


@pytest.mark.parametrize("gpu,state,flag", [("h100-sxm", None, True), ("a100-sxm-80gb", None, False),
                                            ("h100-sxm", False, False), ("a100-sxm-80gb", True, True)])
def test_megatron_export_writes_what_was_priced_and_round_trips(tmp_path, gpu, state, flag):
    inputs = PlanInputs(model="llama-3.1-8b", gpus=8, tp=4, framework="megatron-core", zero=1, seq_len=4096,
                        gpu=gpu, tp_comm_overlap=state)
    (f,) = [x for x in export_plan(inputs, "megatron") if x.name.endswith(".sh")]
    assert ("--tp-comm-overlap" in f.text) is flag
    p = tmp_path / f.name
    p.write_text(f.text)
    back = build_plan(PlanInputs(**{**import_configs([p]).merged(), "gpu": gpu}))
    assert back.runtime.tp_comm_overlap == state
    assert estimate_compute(back).step_time_s == estimate_compute(build_plan(inputs)).step_time_s


def test_megatron_export_refuses_tp_overlap_without_sequence_parallelism():
    with pytest.raises(SpecError, match="sequence"):
        export_plan(PlanInputs(model="llama-3.1-8b", gpus=8, tp=4, sp=False, framework="megatron-core",
                               tp_comm_overlap=True), "megatron")


def test_tp_overlap_needs_sequence_parallelism():
    """TE's userbuffers and torch's AsyncTP overlap the sequence-parallel all-gathers and
    reduce-scatters: TP without SP all-reduces between the GEMMs, exposed whatever the profile says."""
    mc = dict(framework="megatron-core", zero=1, sp=False)
    assert _step(**mc) == _step(tp_comm_overlap=False, **mc)
    assert _step(framework="megatron-core", zero=1) < _step(**mc)
    plan = build_plan(PlanInputs(**{**TP8, **mc}))
    assert any("needs sequence parallelism" in n for n in estimate_compute(plan).notes)
