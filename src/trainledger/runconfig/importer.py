"""Read a user's existing run configuration back into plan inputs.

Understands DeepSpeed JSON, Accelerate config YAML/JSON, Hugging Face ``TrainingArguments``
(JSON/YAML, TRL's ``max_length``/``max_seq_length`` too), peft ``LoraConfig`` (JSON/YAML,
``adapter_config.json``), and the launch scripts trainledger exports (torchrun/Slurm). Several
files can be combined (e.g. training args + DeepSpeed JSON + LoRA config); the model is given
separately. Every key is accounted for: used for sizing, known but without effect on sizing, or
unknown (reported). Contradictions between files are errors that show the arithmetic.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from trainledger.load.catalog import read_data_file
from trainledger.errors import PlanError, SpecError
from trainledger.safety import read_text
from trainledger.runconfig import guards
from trainledger.runconfig.serving import SERVING_FORMATS
from trainledger.runconfig.serving import reader as serving_reader

from trainledger.runconfig.formats import (
    BNB_KEYS, ImportResult, read_accelerate, read_bnb, read_deepspeed, read_launch, read_peft, read_trainer_args,
)
from trainledger.runconfig.importers import detect_tool, read_toml, read_tool


# ----------------------------------------------------------------------------- detection
TEXT_SUFFIXES = (".sh", ".sbatch", ".bash", ".args", ".txt", ".cmd")


def detect_format(data: Any, path: Path) -> str:
    if path.suffix in TEXT_SUFFIXES:
        tool = detect_tool(str(data), path)
        if tool:
            return tool
        from trainledger.runconfig.serving import detect_serving  # vllm serve / sglang.launch_server scripts (issue 16)

        return detect_serving(str(data)) or ("slurm" if "#SBATCH" in str(data) else "torchrun")
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping of config keys")
    tool = detect_tool(data, path)
    if tool:
        return tool
    keys = set(data) - {"_trainledger"}
    if keys & {"zero_optimization", "train_micro_batch_size_per_gpu", "train_batch_size"}:
        return "deepspeed"
    if keys & {"compute_environment", "distributed_type"}:
        return "accelerate"
    if "peft_type" in keys or {"r", "target_modules"} <= keys or {"r", "lora_alpha"} <= keys:
        return "peft"
    if keys & BNB_KEYS and not keys - BNB_KEYS:
        return "bnb"
    if keys and keys <= {"fsdp", "fsdp_config"}:
        return "fsdp"
    if keys & {"per_device_train_batch_size", "gradient_accumulation_steps", "optim", "output_dir"}:
        return "trainer-args"
    raise SpecError(f"{path}: not a DeepSpeed, Accelerate, TrainingArguments, FSDP, peft, axolotl, TRL, "
                    f"LLaMA-Factory, torchtitan, Megatron, NeMo or NeMo AutoModel config (keys: {', '.join(sorted(map(str, keys))[:8])})")


_HEADER_RE = re.compile(r"^#\s*trainledger-plan:\s*(\{.*\})\s*$", re.M)


def _read_header(text: str, data: Any) -> dict[str, Any]:
    if isinstance(data, dict) and isinstance(data.get("_trainledger"), dict):
        inputs = data["_trainledger"].get("inputs")
        return dict(inputs) if isinstance(inputs, dict) else {}
    m = _HEADER_RE.search(text)
    if m:
        try:
            return dict(json.loads(m.group(1)))
        except (json.JSONDecodeError, TypeError, ValueError):
            raise SpecError("the trainledger-plan header line is not valid JSON") from None
    return {}


_READERS = {"deepspeed": read_deepspeed, "accelerate": read_accelerate, "trainer-args": read_trainer_args,
            "fsdp": read_trainer_args, "peft": read_peft, "bnb": read_bnb}
_READERS.update({f: serving_reader(f) for f in SERVING_FORMATS})


def import_configs(paths: list[str | Path]) -> ImportResult:
    """Read config files into plan inputs. Raises SpecError/PlanError on bad or contradictory input."""
    res = ImportResult()
    for raw in paths:
        path = Path(raw)
        where = path.name
        if not path.exists():
            raise SpecError(f"{path}: no such file")
        if path.suffix in TEXT_SUFFIXES:
            text = guards.read_script(path)
            data: Any = text
        elif path.suffix == ".toml":
            text = read_text(path)
            data = read_toml(text, path)
        else:
            data = read_data_file(path)
            text = read_text(path)
        fmt = detect_format(data, path)
        guards.check_config(fmt, data, where)
        res.formats[where] = fmt
        header = _read_header(text, data)
        guards.check_header(header, where)
        for k, v in header.items():
            res.header.setdefault(k, v)
        if fmt in ("slurm", "torchrun"):
            read_launch(text, res, where)
        elif fmt in _READERS:
            _READERS[fmt](data, res, where)
        else:
            read_tool(fmt, data, res, where)
    _normalize_model(res)
    _check_batch(res)
    return res


def _normalize_model(res: ImportResult) -> None:
    """A Hub id that is the source of a bundled preset becomes that preset's name."""
    model = res.inputs.get("model")
    if not isinstance(model, str):
        return
    from trainledger.load.hf import preset_sources

    preset = preset_sources().get(model.lower())
    if preset:
        res.notes.append(f"{res.sources['model']}: model {model} = bundled preset {preset}")
        res.inputs["model"] = preset


def _check_batch(res: ImportResult) -> None:
    merged = res.merged()
    mb, ga = merged.get("micro_batch", 1), merged.get("grad_accum", 1)
    for name, value, where in res.checks:
        if name != "train_batch_size" or value is None:
            continue
        per_replica = mb * ga
        if value % per_replica:
            raise PlanError(
                f"{where}: train_batch_size {value} is not micro-batch × grad-accum × dp: "
                f"{mb} × {ga} = {per_replica} does not divide {value}")
        dp = value // per_replica  # consistent: the global batch follows from mb × ga × dp
        gpus = merged.get("gpus")
        mp = merged.get("tp", 1) * merged.get("pp", 1) * merged.get("cp", 1)
        if gpus is not None and gpus // mp != dp:
            raise PlanError(
                f"{where}: train_batch_size {value} = {mb} × {ga} × dp gives dp = {dp}, but "
                f"{res.sources.get('gpus', 'the plan')} has {gpus} GPUs / (tp·pp·cp = {mp}) = {gpus // mp}")
        if gpus is None and "gpus" not in res.header:
            res.set("gpus", dp * mp, where)
