"""Input checks of the ``--from`` importer, before its readers see a file (issue 20).

The readers in :mod:`trainledger.runconfig.importer` assume the shapes the real tools write:
DeepSpeed's ``zero_optimization`` is an object, peft's ``lora_alpha`` a number, and so on. A file
with ``Infinity``/``NaN`` (Python's json accepts both), a string or list where an object belongs,
or a header with a zero micro-batch made 16 tracebacks. Here every such value is one SpecError
naming the file and the key; launch scripts are read through the same regular-file guard as every
other config (:func:`trainledger.safety.read_text`: no FIFO hang, no /dev/zero, bounded size).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from trainledger.errors import SpecError
from trainledger.safety import clip, read_text

#: a launch script is a few KB; the largest accepted (bytes)
MAX_SCRIPT_BYTES = 1024 * 1024

_NUMBER = (int, float)
_TEXT = (str,)
_OBJ = (dict,)

#: per format: dotted key -> (accepted types, words for the message). Absent or null keys are fine.
SHAPES: dict[str, dict[str, tuple[tuple[type, ...], str]]] = {
    "deepspeed": {
        "zero_optimization": (_OBJ, "an object"),
        "zero_optimization.offload_optimizer": (_OBJ, "an object"),
        "zero_optimization.offload_optimizer.device": (_TEXT, "a string"),
        "zero_optimization.offload_param": (_OBJ, "an object"),
        "zero_optimization.offload_param.device": (_TEXT, "a string"),
        "optimizer": (_OBJ, "an object"),
        "optimizer.type": (_TEXT, "a string"),
        "optimizer.params": (_OBJ, "an object"),
        "train_batch_size": (_NUMBER + _TEXT, "a positive integer or 'auto'"),
        "train_micro_batch_size_per_gpu": (_NUMBER + _TEXT, "a positive integer or 'auto'"),
        "gradient_accumulation_steps": (_NUMBER + _TEXT, "a positive integer or 'auto'"),
    },
    "accelerate": {
        "mixed_precision": (_TEXT, "a string"),
        "distributed_type": (_TEXT, "a string"),
        "num_processes": (_NUMBER, "a positive integer"),
        "num_machines": (_NUMBER, "a positive integer"),
        "deepspeed_config": (_OBJ, "an object"),
        "deepspeed_config.zero_stage": (_NUMBER + _TEXT, "0, 1, 2 or 3"),
        "deepspeed_config.gradient_accumulation_steps": (_NUMBER + _TEXT, "a positive integer or 'auto'"),
        "deepspeed_config.offload_optimizer_device": (_TEXT, "a string"),
        "deepspeed_config.offload_param_device": (_TEXT, "a string"),
        "fsdp_config": (_OBJ, "an object"),
    },
    "trainer-args": {
        "per_device_train_batch_size": (_NUMBER + _TEXT, "a positive integer"),
        "gradient_accumulation_steps": (_NUMBER + _TEXT, "a positive integer"),
        "optim": (_TEXT, "a string"),
        "fsdp": ((str, list), "a string or a list of strings"),
        "max_length": (_NUMBER, "a positive integer"),
        "max_seq_length": (_NUMBER, "a positive integer"),
        "max_steps": (_NUMBER, "an integer"),
    },
    "peft": {
        "r": (_NUMBER, "a positive integer"),
        "lora_alpha": (_NUMBER, "a number"),
        "peft_type": (_TEXT, "a string"),
        "target_modules": ((str, list), "a string or a list of strings"),
    },
}
SHAPES["fsdp"] = SHAPES["trainer-args"]
#: list-valued keys whose items must be strings
STRING_LISTS = {"fsdp", "target_modules"}
#: plan inputs the batch arithmetic of the importer uses (from a file or its trainledger header)
BATCH_KEYS = ("micro_batch", "grad_accum", "gpus", "tp", "pp", "cp")


def read_script(path: Path) -> str:
    """A launch script's text through the regular-file guard (SpecError for FIFOs, devices, huge files)."""
    return read_text(path, MAX_SCRIPT_BYTES, what="launch script")


def _finite(data: Any, where: str) -> None:
    """No Infinity/NaN anywhere in a parsed config (the tools that write these files never do)."""
    stack: list[tuple[Any, str]] = [(data, "")]
    while stack:
        obj, at = stack.pop()
        if isinstance(obj, float) and not math.isfinite(obj):
            raise SpecError(f"{where}: {at or 'value'} is {obj!r}; a config value is a finite number")
        if isinstance(obj, dict):
            stack.extend((v, f"{at}.{k}" if at else str(k)) for k, v in obj.items())
        elif isinstance(obj, list):
            stack.extend((v, f"{at}[{i}]") for i, v in enumerate(obj))


def _lookup(data: dict[str, Any], dotted: str) -> tuple[bool, Any]:
    obj: Any = data
    for part in dotted.split("."):
        if not isinstance(obj, dict) or obj.get(part) is None:
            return False, None
        obj = obj[part]
    return True, obj


def check_config(fmt: str, data: Any, where: str) -> None:
    """Raise SpecError when a parsed config has a value of a shape its reader does not take."""
    _finite(data, where)
    if not isinstance(data, dict):
        return
    for dotted, (types, words) in SHAPES.get(fmt, {}).items():
        found, value = _lookup(data, dotted)
        if not found:
            continue
        if isinstance(value, bool) or not isinstance(value, types):
            raise SpecError(f"{where}: {dotted} must be {words} (got {clip(value)})")
        if dotted.rsplit(".", 1)[-1] in STRING_LISTS and isinstance(value, list) \
                and not all(isinstance(x, str) for x in value):
            raise SpecError(f"{where}: {dotted} must be {words} (got {clip(value)})")
    tl = data.get("_trainledger")
    if tl is not None and (not isinstance(tl, dict) or not isinstance(tl.get("inputs", {}), dict)):
        raise SpecError(f"{where}: _trainledger must be an object with an 'inputs' object")


def check_header(header: dict[str, Any], where: str) -> None:
    """The batch inputs of a trainledger header are positive integers (they are multiplied below)."""
    _finite(header, where)
    for key in BATCH_KEYS:
        v = header.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
            raise SpecError(f"{where}: trainledger header: {key} must be a positive integer (got {clip(v)})")


#: command-line flags that change micro-batch × grad-accum × dp after the files were read
LAYOUT_FLAGS = ("gpus", "dp", "tp", "pp", "cp", "micro_batch", "grad_accum")


def keep_train_batch(data: dict[str, Any], checks: list[tuple[str, Any, str]], flags: set[str]) -> dict[str, Any]:
    """A DeepSpeed ``train_batch_size`` still holds when flags change the layout (issue 20).

    The importer checks it against the files alone; a ``--gpus`` flag given beside ``--from`` used
    to replace the GPU count silently. When such a flag is given (and no ``--global-batch``), the
    file's train_batch_size becomes the plan's global batch, so that the plan's own check
    (micro-batch × grad-accum × dp) reports a contradiction instead of dropping it.
    """
    tb = next((v for name, v, _ in checks if name == "train_batch_size" and v is not None), None)
    if tb is None or data.get("global_batch") is not None or not flags & set(LAYOUT_FLAGS):
        return data
    return {**data, "global_batch": tb}
