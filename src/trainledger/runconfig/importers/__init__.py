"""Per-tool readers of training configs: axolotl, TRL, LLaMA-Factory, torchtitan, Megatron-LM / NeMo,
NeMo AutoModel, Megatron-Bridge.

Each module has ``detect`` (does this mapping/text look like the tool's config?) and ``read``
(fill an :class:`~trainledger.runconfig.importer.ImportResult`). DeepSpeed, Accelerate, Trainer
arguments, peft and bitsandbytes stay in :mod:`trainledger.runconfig.importer`.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from trainledger.errors import SpecError
from trainledger.runconfig.formats import ImportResult
from trainledger.runconfig.importers import automodel, axolotl, bridge, llamafactory, megatron, torchtitan, trl

TOOLS = ("axolotl", "trl", "llamafactory", "torchtitan", "megatron", "nemo", "automodel", "bridge")


def read_toml(text: str, path: Path) -> Any:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{path}: not valid TOML ({exc})") from None


def detect_tool(data: Any, path: Path) -> str | None:
    """The tool whose config this is, or None (then the DeepSpeed/Accelerate/Trainer rules apply)."""
    if isinstance(data, str):
        return "megatron" if megatron.detect_text(data) else None
    if not isinstance(data, dict):
        return None
    keys = set(data) - {"_trainledger"}
    if torchtitan.detect(data):
        return "torchtitan"
    if automodel.detect(data):
        return "automodel"
    if bridge.detect(data):
        return "bridge"
    if megatron.detect_nemo_yaml(data):
        return "nemo"
    if axolotl.detect(keys):
        return "axolotl"
    if llamafactory.detect(keys):
        return "llamafactory"
    if trl.detect(keys):
        return "trl"
    return None


def read_tool(fmt: str, data: Any, res: ImportResult, where: str) -> None:
    if fmt == "megatron":
        megatron.read_text(data, res, where)
    elif fmt == "nemo":
        megatron.read_nemo_yaml(data, res, where)
    elif fmt == "torchtitan":
        torchtitan.read(data, res, where)
    elif fmt == "automodel":
        automodel.read(data, res, where)
    elif fmt == "bridge":
        bridge.read(data, res, where)
    elif fmt == "axolotl":
        axolotl.read(data, res, where)
    elif fmt == "llamafactory":
        llamafactory.read(data, res, where)
    elif fmt == "trl":
        trl.read(data, res, where)
    else:  # pragma: no cover - detect_tool returns only the names above
        raise SpecError(f"{where}: no reader for {fmt}")


#: where each tool states the essentials (named in the error when a file leaves them out)
ESSENTIAL_KEYS = {
    "model": "base_model (axolotl), model_name_or_path (TRL, LLaMA-Factory), [model] name + flavor "
             "(torchtitan), --num-layers/--hidden-size/... or --tokenizer-model (Megatron), "
             "model.config.pretrained_model_name_or_path (NeMo AutoModel), model.hf_model_id (Megatron-Bridge)",
    "seq_len": "sequence_len (axolotl), max_length (TRL), cutoff_len (LLaMA-Factory), [training] seq_len "
               "(torchtitan), --seq-length (Megatron), encoder_seq_length (NeMo), dataset.seq_len "
               "(NeMo AutoModel), model.seq_length (Megatron-Bridge)",
}


def require_essentials(data: dict[str, Any], paths: Any) -> None:
    """A plan read with --from must state the model and the sequence length (files or flags):
    never a silent default."""
    names = ", ".join(Path(str(p)).name for p in paths)
    for key, where in ESSENTIAL_KEYS.items():
        if data.get(key) is None:
            flag = "--" + key.replace("_", "-")
            what = {"seq_len": "sequence length"}.get(key, key)
            raise SpecError(f"{names} do{'es' if len(list(paths)) == 1 else ''} not state the {what}: "
                            f"add {where} to the file, or pass {flag}")
