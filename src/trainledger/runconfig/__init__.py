"""From plan to run: export a plan as launch configuration, and read a user's configs back.

``export_plan(inputs, fmt)`` writes torchrun, Accelerate, DeepSpeed, FSDP, Trainer-arguments and
Slurm files from a plan; ``import_configs(paths)`` reads DeepSpeed JSON, Accelerate YAML,
``TrainingArguments`` (JSON/YAML) and peft configs back into plan inputs, reporting every key it
does not understand and every contradiction (with the arithmetic).
"""

from trainledger.runconfig.export import EXPORT_FORMATS, SERVING_EXPORT_FORMATS, ExportedFile, export_plan
from trainledger.runconfig.importer import ImportResult, import_configs

__all__ = ["EXPORT_FORMATS", "SERVING_EXPORT_FORMATS", "ExportedFile", "export_plan", "ImportResult", "import_configs"]
