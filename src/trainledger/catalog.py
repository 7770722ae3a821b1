"""Load and validate the bundled catalog (GPUs, networks, model presets, prices).

One small data file per item under ``catalog/``, each with its ``source`` and ``checked`` date
(DESIGN.md §3.11). A user's own file path works wherever a catalog name does.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ._spec import spec_error
from .cluster import GpuSpec, NetworkSpec
from .errors import CatalogError, SpecError, did_you_mean

MAX_FILE_BYTES = 4 * 1024 * 1024  # a catalog or config file larger than this is not a config


def _catalog_dir(kind: str) -> Path:
    return Path(str(resources.files("trainledger") / "catalog" / kind))


def read_data_file(path: Path) -> Any:
    """Read a YAML or JSON file with a size limit, raising SpecError naming the file."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise SpecError(f"{path}: cannot read ({exc.strerror})") from None
    if size > MAX_FILE_BYTES:
        raise SpecError(f"{path}: {size} bytes is too large for a config file (limit {MAX_FILE_BYTES})")
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        if path.suffix == ".json":
            return json.loads(text)
        return yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError, RecursionError) as exc:
        raise SpecError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'} ({exc})") from None


@lru_cache(maxsize=None)
def _entries(kind: str) -> dict[str, Path]:
    d = _catalog_dir(kind)
    out: dict[str, Path] = {}
    for p in sorted(d.glob("*")):
        if p.suffix in (".yaml", ".yml", ".json"):
            out[p.stem] = p
    return out


def names(kind: str) -> list[str]:
    """Catalog names of one kind ('gpus', 'networks', 'models', 'prices')."""
    return list(_entries(kind))


def _resolve(kind: str, name_or_path: str | Path) -> Path:
    s = str(name_or_path)
    p = Path(s)
    if p.suffix in (".yaml", ".yml", ".json") or p.exists():
        if not p.exists():
            raise CatalogError(f"{p}: no such file")
        return p
    entries = _entries(kind)
    key = s.lower()
    if key in entries:
        return entries[key]
    singular = kind.rstrip("s")
    raise CatalogError(f"unknown {singular} {s!r}.{did_you_mean(s, entries)} "
                       f"(`trainledger {kind}` lists them)")


@lru_cache(maxsize=256)
def load_gpu(name_or_path: str) -> GpuSpec:
    """A GPU spec by catalog name (e.g. 'h100-sxm') or from a YAML/JSON file."""
    path = _resolve("gpus", name_or_path)
    data = read_data_file(path)
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping of GPU fields")
    data.setdefault("name", path.stem)
    try:
        return GpuSpec.model_validate(data)
    except ValidationError as exc:
        raise spec_error(exc, str(path)) from None


@lru_cache(maxsize=256)
def load_network(name_or_path: str) -> NetworkSpec:
    """A link/network spec by catalog name (e.g. 'nvlink4', 'ib-ndr') or from a file."""
    path = _resolve("networks", name_or_path)
    data = read_data_file(path)
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping of network fields")
    data.setdefault("name", path.stem)
    try:
        return NetworkSpec.model_validate(data)
    except ValidationError as exc:
        raise spec_error(exc, str(path)) from None


def all_gpus() -> list[GpuSpec]:
    return [load_gpu(n) for n in names("gpus")]


def all_networks() -> list[NetworkSpec]:
    return [load_network(n) for n in names("networks")]
