"""The price catalog: cloud GPU-hour prices, GPU server purchase prices, facility defaults.

Data files live in ``catalog/prices/`` (DESIGN.md §3.11), apart from the hardware specs:

* ``kind: cloud`` — one file per provider: USD per GPU-hour by GPU catalog name and pricing tier
  (``on-demand``, ``reserved``, ``spot``), each with the instance it was derived from;
* ``kind: server`` — one file per server: purchase price, GPUs per server, system power;
* ``kind: facility`` — defaults of the facility and data-pipeline inputs, each with its source.

A user's ``--prices FILE`` holds one item of the same shape, or ``items: [...]``; its entries
override the bundled ones (cloud tiers are merged per GPU).
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError

from trainledger.spec.base import Spec, spec_error
from trainledger.load.catalog import read_data_file
from trainledger.errors import CatalogError, SpecError, did_you_mean

Tier = Literal["on-demand", "reserved", "spot"]
TIERS: tuple[str, ...] = ("on-demand", "reserved", "spot")


class TierPrice(Spec):
    """One published price: USD per GPU-hour, and the instance price it was divided from."""

    usd_per_gpu_hour: float = Field(gt=0)
    instance: str | None = None
    gpus_per_instance: int | None = Field(None, gt=0)
    instance_usd_per_hour: float | None = Field(None, gt=0)
    as_of: _dt.date | None = Field(None, description="date the price was published or quoted")


class CloudPrices(Spec):
    """A provider's GPU prices (``kind: cloud``)."""

    kind: Literal["cloud"] = "cloud"
    provider: str
    display_name: str | None = None
    region: str | None = None
    source: str
    checked: _dt.date
    notes: str | None = None
    gpus: dict[str, dict[Tier, TierPrice]]


class ServerPrice(Spec):
    """Purchase price of one GPU server (``kind: server``)."""

    kind: Literal["server"] = "server"
    name: str
    display_name: str | None = None
    gpu: str = Field(description="GPU catalog name")
    gpu_aliases: tuple[str, ...] = ()
    gpus_per_server: int = Field(gt=0)
    usd: float = Field(gt=0)
    system_power_max_w: float | None = Field(None, gt=0, description="maximum system power, W")
    system_power_source: str | None = None
    source: str
    as_of: _dt.date | None = None
    checked: _dt.date
    notes: str | None = None


class FacilityValue(Spec):
    value: float
    source: str


class Facility(Spec):
    """Facility and pipeline defaults (``kind: facility``)."""

    kind: Literal["facility"] = "facility"
    name: str = "facility"
    checked: _dt.date
    values: dict[str, FacilityValue]


@dataclass(frozen=True)
class Quote:
    """A resolved cloud price and where it came from."""

    provider: str
    tier: str
    usd_per_gpu_hour: float
    source: str
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class PriceCatalog:
    clouds: dict[str, CloudPrices]
    servers: list[ServerPrice]
    facility: Facility
    _quotes: dict[str, list[Quote]] = field(default_factory=dict, repr=False)

    def default(self, key: str) -> FacilityValue:
        try:
            return self.facility.values[key]
        except KeyError:
            raise CatalogError(
                f"facility default {key!r} missing from catalog/prices/facility.yaml"
            ) from None

    def quote(self, gpu: str, provider: str, tier: str) -> Quote:
        """The price of one GPU-hour of ``gpu`` at ``provider`` in ``tier``."""
        cloud = self.clouds.get(provider.lower())
        if cloud is None:
            raise CatalogError(f"unknown provider {provider!r}.{did_you_mean(provider, self.clouds)} "
                               f"Known: {', '.join(sorted(self.clouds))}; or give --price-per-gpu-hour")
        tiers = cloud.gpus.get(gpu)
        if not tiers:
            have = [p for p, c in self.clouds.items() if gpu in c.gpus]
            raise CatalogError(
                f"provider {provider!r} has no price for GPU {gpu!r} in the catalog; providers that do: "
                f"{', '.join(have) or 'none'}; give --price-per-gpu-hour or a --prices FILE"
            )
        if tier not in tiers:
            raise CatalogError(
                f"provider {provider!r} has no {tier} price for {gpu!r}; it has: {', '.join(tiers)}"
            )
        p = tiers[tier]  # type: ignore[index]
        detail = {k: v for k, v in p.model_dump(mode="json").items() if v is not None}
        return Quote(provider, tier, p.usd_per_gpu_hour, f"{cloud.source} (checked {cloud.checked})", detail)

    def quotes_for(self, gpu: str) -> list[Quote]:
        """Every catalog price for ``gpu``, cheapest first (cached: the catalog does not change)."""
        if gpu not in self._quotes:
            out = [self.quote(gpu, prov, tier) for prov, c in self.clouds.items()
                   for tier in c.gpus.get(gpu, {})]
            self._quotes[gpu] = sorted(out, key=lambda q: q.usd_per_gpu_hour)
        return list(self._quotes[gpu])

    def server_for(self, gpu: str) -> ServerPrice | None:
        for s in self.servers:
            if gpu == s.gpu or gpu in s.gpu_aliases:
                return s
        return None


def _prices_dir() -> Path:
    return Path(str(resources.files("trainledger") / "catalog" / "prices"))


def _parse_item(data: Any, where: str) -> CloudPrices | ServerPrice | Facility:
    if not isinstance(data, dict) or data.get("kind") not in ("cloud", "server", "facility"):
        raise SpecError(f"{where}: a price file item needs kind: cloud | server | facility")
    cls = {"cloud": CloudPrices, "server": ServerPrice, "facility": Facility}[data["kind"]]
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise spec_error(exc, where) from None


def _read_items(path: Path) -> list[CloudPrices | ServerPrice | Facility]:
    data = read_data_file(path)
    if isinstance(data, dict) and "items" in data:
        items = data["items"]
        if not isinstance(items, list):
            raise SpecError(f"{path}: items must be a list of price items")
        return [_parse_item(d, f"{path} items[{i}]") for i, d in enumerate(items)]
    return [_parse_item(data, str(path))]


def _merge(cat: PriceCatalog, item: CloudPrices | ServerPrice | Facility) -> None:
    cat._quotes.clear()
    if isinstance(item, CloudPrices):
        key = item.provider.lower()
        old = cat.clouds.get(key)
        if old is None:
            cat.clouds[key] = item
        else:
            gpus = {g: dict(t) for g, t in old.gpus.items()}
            for g, tiers in item.gpus.items():
                gpus.setdefault(g, {}).update(tiers)
            cat.clouds[key] = item.model_copy(update={"gpus": gpus})
    elif isinstance(item, ServerPrice):
        cat.servers.insert(0, item)
    else:
        values = dict(cat.facility.values)
        values.update(item.values)
        cat.facility = cat.facility.model_copy(update={"values": values})


@lru_cache(maxsize=16)
def load_prices(extra_file: str | None = None) -> PriceCatalog:
    """The bundled price catalog, with a user's price file (if any) merged over it."""
    cat = PriceCatalog(clouds={}, servers=[], facility=Facility(checked=_dt.date(1970, 1, 1), values={}))
    for p in sorted(_prices_dir().glob("*")):
        if p.suffix in (".yaml", ".yml", ".json"):
            for item in _read_items(p):
                _merge(cat, item)
    if extra_file:
        path = Path(extra_file)
        if not path.exists():
            raise SpecError(f"{path}: no such prices file")
        for item in _read_items(path):
            _merge(cat, item)
    return cat
