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

from trainledger.spec.base import spec_error
from trainledger.spec.cluster import GpuSpec, NetworkSpec
from trainledger.errors import CatalogError, SpecError, did_you_mean

#: relative tolerance when a GPU's link_gb_per_s is compared with its link's catalog bandwidth
LINK_BANDWIDTH_SLACK = 1.001

MAX_FILE_BYTES = 4 * 1024 * 1024  # a catalog or config file larger than this is not a config


def catalog_dir(kind: str) -> Path:
    return Path(str(resources.files("trainledger") / "catalog" / kind))


def read_data_file(path: Path) -> Any:
    """Read a YAML or JSON file with a size limit, raising SpecError naming the file.

    Only regular files are read, at most MAX_FILE_BYTES, and the parsed data is bounded in depth
    and size (:mod:`trainledger.safety`: no FIFO/device hangs, no YAML alias bombs).
    """
    from trainledger.safety import check_tree, read_text

    text = read_text(path, MAX_FILE_BYTES)
    try:
        if path.suffix == ".json":
            data = json.loads(text)
        else:
            data = yaml.safe_load(text)
    except (ValueError, yaml.YAMLError, RecursionError) as exc:  # ValueError: JSON, ints > 4300 digits
        raise SpecError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'} "
                        f"({' '.join(str(exc).split())[:200]})") from None
    return check_tree(data, str(path))


@lru_cache(maxsize=None)
def entries(kind: str) -> dict[str, Path]:
    d = catalog_dir(kind)
    out: dict[str, Path] = {}
    for p in sorted(d.glob("*")):
        if p.suffix in (".yaml", ".yml", ".json"):
            out[p.stem] = p
    return out


def names(kind: str) -> list[str]:
    """Catalog names of one kind ('gpus', 'networks', 'models', 'prices')."""
    return list(entries(kind))


def suggest(name: str, choices: list[str], n: int = 4) -> str:
    """' Did you mean: a, b?' — names that start with or contain ``name`` first, then close spellings."""
    key = name.lower()
    ranked = [c for c in choices if c.startswith(key)] + [c for c in choices if key in c and not c.startswith(key)]
    if len(ranked) < n:
        extra = did_you_mean(name, [c for c in choices if c not in ranked], n=n - len(ranked))
        ranked += [c.strip() for c in extra.removeprefix(" Did you mean: ").rstrip("?").split(",") if c.strip()]
    return " Did you mean: " + ", ".join(ranked[:n]) + "?" if ranked else ""


def _resolve(kind: str, name_or_path: str | Path) -> Path:
    s = str(name_or_path)
    from trainledger.safety import clip, is_file

    p = Path(s).expanduser()
    if p.suffix in (".yaml", ".yml", ".json") or is_file(p):
        if not is_file(p):
            raise CatalogError(f"{p}: no such file (a {kind.rstrip('s')} is a catalog name or a "
                               f".yaml/.json file)")
        return p
    known = entries(kind)
    key = s.lower()
    if key in known:
        return known[key]
    singular = kind.rstrip("s")
    raise CatalogError(f"unknown {singular} {clip(s, 80)}.{suggest(s[:200], list(known))} "
                       f"(`trainledger {kind}` lists them; a .yaml file path works too)")


def _invalid(exc: ValidationError, path: Path) -> SpecError:
    """One line naming the file and each field; cross-field errors already start with the field."""
    errors = exc.errors()
    if any(e.get("type") == "missing" for e in errors):
        missing = [".".join(map(str, e["loc"])) for e in errors if e.get("type") == "missing"]
        return SpecError(f"{path}: missing required field(s): {', '.join(missing)}")
    if errors and all(not e.get("loc") for e in errors):
        msg = "; ".join(str(e.get("msg", "invalid")).removeprefix("Value error, ") for e in errors)
        return SpecError(f"{path}: {msg}")
    return spec_error(exc, str(path))


def _read_mapping(path: Path, what: str) -> dict[str, Any]:
    data = read_data_file(path)
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping of {what} fields (key: value lines), "
                        f"got {type(data).__name__}")
    bad = [k for k in data if not isinstance(k, str)]
    if bad:
        raise SpecError(f"{path}: field names must be text, got {bad[0]!r}")
    data.setdefault("name", path.stem)
    return data


def _check_link(gpu: GpuSpec, path: Path) -> GpuSpec:
    """The GPU's intra-node link must exist in the network catalog (or as a file next to it).

    A link file named relative to a user's GPU file is rewritten to its absolute path, so that
    ``load_network(gpu.link)`` works from any working directory.
    """
    link = gpu.link
    local = path.parent / link
    is_local = path.parent != catalog_dir("gpus") and local.is_file()
    ref = str(local.resolve()) if is_local else link
    try:
        net = load_network(ref)
    except CatalogError:
        raise SpecError(f"{path}: link: unknown network {link!r}.{suggest(link, names('networks'))} "
                        f"(`trainledger networks` lists them)") from None
    if net.scope != "intra-node":
        raise SpecError(f"{path}: link: {link!r} is an {net.scope} network; name the GPU-to-GPU "
                        f"link inside a node (nvlink*, pcie*-x16, ...)")
    if gpu.link_bytes_per_s > net.bytes_per_s * LINK_BANDWIDTH_SLACK:
        raise SpecError(f"{path}: link_gb_per_s: {gpu.link_gb_per_s:g} GB/s exceeds {link!r} "
                        f"({net.bytes_per_s / 1e9:g} GB/s per direction)")
    return gpu.model_copy(update={"link": ref}) if is_local else gpu


@lru_cache(maxsize=256)
def load_gpu(name_or_path: str) -> GpuSpec:
    """A GPU spec by catalog name (e.g. 'h100-sxm') or from a YAML/JSON file.

    Validates each field, the cross-field rules of :func:`trainledger.spec.cluster.gpu_problems`, and
    that ``link`` names a known intra-node network whose bandwidth covers ``link_gb_per_s``.
    """
    path = _resolve("gpus", name_or_path)
    data = _read_mapping(path, "GPU")
    try:
        gpu = GpuSpec.model_validate(data)
    except ValidationError as exc:
        raise _invalid(exc, path) from None
    return _check_link(gpu, path)


@lru_cache(maxsize=256)
def load_network(name_or_path: str) -> NetworkSpec:
    """A link/network spec by catalog name (e.g. 'nvlink4', 'ib-ndr') or from a file."""
    path = _resolve("networks", name_or_path)
    data = _read_mapping(path, "network")
    try:
        return NetworkSpec.model_validate(data)
    except ValidationError as exc:
        raise _invalid(exc, path) from None


def all_gpus(vendor: str | None = None) -> list[GpuSpec]:
    """Every bundled GPU (optionally of one vendor: nvidia, amd, intel)."""
    gpus = [load_gpu(n) for n in names("gpus")]
    if vendor is None:
        return gpus
    known = sorted({g.vendor for g in gpus})
    if vendor.lower() not in known:
        raise CatalogError(f"unknown vendor {vendor!r}: use one of {', '.join(known)}")
    return [g for g in gpus if g.vendor == vendor.lower()]


def all_networks(scope: str | None = None) -> list[NetworkSpec]:
    """Every bundled link/network (optionally 'intra-node' or 'inter-node' only)."""
    nets = [load_network(n) for n in names("networks")]
    return nets if scope is None else [n for n in nets if n.scope == scope]
