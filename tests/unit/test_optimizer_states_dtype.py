"""16-bit optimizer states (``--optimizer-states-dtype``): Megatron-Core's precision-aware optimizer
(--exp-avg-dtype / --exp-avg-sq-dtype, with the 16-bit remainders of the fp32 master weights),
torchtitan's fused_opt_states_bf16; refused where the stack has none."""

from __future__ import annotations

import pytest

from trainledger.errors import TrainledgerError
from trainledger.estimate import estimate
from trainledger.load.plan import PlanInputs, build_plan
from trainledger.runconfig import export_plan, import_configs

FSDP = dict(model="llama-3.1-8b", gpus=8, zero=3, framework="fsdp2", seq_len=4096)
MCORE = dict(model="llama-3.1-8b", gpus=8, zero=1, framework="megatron-core", seq_len=4096, precision="fp8-mixed")


def _terms(**kw) -> dict[str, float]:
    return {t.name: t.value for t in estimate(build_plan(PlanInputs(**kw))).memory.terms}


def test_bf16_moments_take_two_bytes_each():
    fp32, bf16 = _terms(**FSDP), _terms(**FSDP, optimizer_states_dtype="bf16")
    assert bf16["optimizer_states"] == pytest.approx(fp32["optimizer_states"] / 2, rel=1e-12)
    assert bf16["weights"] == fp32["weights"]


def test_megatron_precision_aware_optimizer_keeps_master_remainders():
    """fp8-mixed keeps bf16 weights: the precision-aware optimizer stores only the low 16 bits of the
    fp32 master (store_param_remainders, its default); Megatron's classic optimizer the whole fp32."""
    base = _terms(**MCORE)
    aware = _terms(**MCORE, optimizer_states_dtype="fp32")
    assert aware["master_weights"] == pytest.approx(base["master_weights"] / 2, rel=1e-12)
    assert aware["optimizer_states"] == base["optimizer_states"]
    bf16 = _terms(**MCORE, optimizer_states_dtype="bf16")
    assert bf16["optimizer_states"] == pytest.approx(base["optimizer_states"] / 2, rel=1e-12)
    # fp16 weights keep the whole fp32 master (no shared bits to drop)
    fp16 = dict(MCORE, precision="fp16-mixed")
    assert _terms(**fp16, optimizer_states_dtype="fp32")["master_weights"] == _terms(**fp16)["master_weights"]


def test_time_and_checkpoint_follow_the_state_bytes():
    a = estimate(build_plan(PlanInputs(**FSDP)))
    b = estimate(build_plan(PlanInputs(**FSDP, optimizer_states_dtype="bf16")))
    assert b.compute.breakdown["optimizer"] < a.compute.breakdown["optimizer"]
    p = build_plan(PlanInputs(**FSDP)).model.params.total
    # the checkpoint holds the two moments of every parameter: 2 x (4 - 2) bytes fewer each
    saved = a.extra["checkpoint"].values["full_bytes"] - b.extra["checkpoint"].values["full_bytes"]
    assert saved == pytest.approx(4 * p, rel=1e-9)


@pytest.mark.parametrize("kw,field", [(dict(framework="deepspeed", zero=2), "optimizer_states_dtype"),
                                      (dict(optimizer="adamw-8bit"), "optimizer_states_dtype")])
def test_refused_where_the_states_have_no_such_dtype(kw, field):
    with pytest.raises(TrainledgerError) as e:
        build_plan(PlanInputs(**{**FSDP, **kw, "optimizer_states_dtype": "bf16"}))
    assert getattr(e.value, "field", None) == field


def test_the_policy_default_is_stored_as_the_default():
    assert build_plan(PlanInputs(**FSDP, optimizer_states_dtype="fp32")).recipe.optimizer_states_dtype is None
    # on megatron-core a stated dtype is the precision-aware optimizer: it stays
    assert build_plan(PlanInputs(**MCORE, optimizer_states_dtype="fp32")).recipe.optimizer_states_dtype == "fp32"


def test_imports(tmp_path):
    t = tmp_path / "t.toml"
    t.write_text('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nseq_len = 4096\n[parallelism]\n'
                 '[optimizer]\nname = "AdamW"\nimplementation = "fused_opt_states_bf16"\n')
    res = import_configs([t])
    assert (res.merged()["optimizer"], res.merged()["optimizer_states_dtype"]) == ("adamw-fused", "bf16")
    assert not res.unknown_keys
    s = tmp_path / "train.sh"
    base = ("torchrun pretrain_gpt.py --num-layers 4 --hidden-size 256 --num-attention-heads 4 --vocab-size 32000 "
            "--seq-length 1024 --micro-batch-size 1 --global-batch-size 8 --bf16 --use-distributed-optimizer ")
    for flags, want in (("--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16", "bf16"),
                        ("--use-precision-aware-optimizer", "fp32"), ("", None)):
        s.write_text(base + flags + "\n")
        assert import_configs([s]).merged().get("optimizer_states_dtype") == want
    s.write_text(base + "--use-precision-aware-optimizer --exp-avg-dtype fp32 --exp-avg-sq-dtype bf16\n")
    res = import_configs([s])
    assert "optimizer_states_dtype" not in res.merged() and any("exp-avg" in u for u in res.unknown_keys)


def test_exports_write_it_or_refuse(tmp_path):
    inputs = PlanInputs(**MCORE, optimizer_states_dtype="bf16")
    (f,) = [x for x in export_plan(inputs, "megatron") if x.name.endswith(".sh")]
    lines = [x.strip() for x in f.text.splitlines()]
    assert {"--use-precision-aware-optimizer", "--exp-avg-dtype bf16", "--exp-avg-sq-dtype bf16"} <= set(lines)
    p = tmp_path / f.name
    p.write_text(f.text)
    assert build_plan(PlanInputs(**import_configs([p]).merged())).recipe.optimizer_states_dtype == "bf16"
    titan = PlanInputs(**{**FSDP, "gpus": 16, "wrap": "layers+embed+head"}, optimizer="adamw-fused",
                       optimizer_states_dtype="bf16")
    (g,) = export_plan(titan, "torchtitan")
    assert 'implementation = "fused_opt_states_bf16"' in g.text
    with pytest.raises(TrainledgerError, match="fused_opt_states_bf16"):
        export_plan(titan.model_copy(update={"optimizer": "adamw"}), "torchtitan")
    with pytest.raises(TrainledgerError, match="state dtype"):
        export_plan(PlanInputs(**FSDP, optimizer_states_dtype="bf16"), "accelerate")


def test_lora_adapters_take_the_stated_states_dtype():
    """LoRA keeps its adapters' states in fp32 under any policy, unless a states dtype is stated."""
    lora = dict(model="llama-3.1-8b", method="lora", seq_len=2048)
    a, b = _terms(**lora), _terms(**lora, optimizer_states_dtype="bf16")
    assert b["optimizer_states"] == pytest.approx(a["optimizer_states"] / 2, rel=1e-12)
