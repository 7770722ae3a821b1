"""Per-device telemetry for ``verify soak``: NVML on NVIDIA GPUs, the host's sensors on CPU.

One :meth:`Sampler.sample` returns a flat dict of the same keys on every path (``None`` where the
path has no such sensor):

    temperature_c, clock_mhz, power_w, utilization_pct, throttle (list of reason names),
    ecc_uncorrected, ecc_corrected, xid_events, nvlink_errors, pcie_replays,
    pcie_tx_bytes_per_s, pcie_rx_bytes_per_s, memory_used_bytes

NVML calls and constants are those of NVIDIA's nvml.h as exposed by ``nvidia-ml-py`` (``import
pynvml``; NVML API reference, "Device Queries"): ``nvmlDeviceGetTemperature(h,
NVML_TEMPERATURE_GPU)``, ``nvmlDeviceGetClockInfo(h, NVML_CLOCK_SM)``, ``nvmlDeviceGetPowerUsage``
(mW), ``nvmlDeviceGetUtilizationRates``, ``nvmlDeviceGetCurrentClocksThrottleReasons`` (bit mask,
:data:`THROTTLE_REASONS`), ``nvmlDeviceGetTotalEccErrors`` (volatile counts),
``nvmlDeviceGetNvLinkErrorCounter`` (per link, CRC/replay/recovery), ``nvmlDeviceGetPcieReplayCounter``,
``nvmlDeviceGetPcieThroughput`` (KB/s over a 20 ms window) and XID critical errors through an
event set (``nvmlEventSetWait_v2`` with a 0 ms timeout). A call the device does not support
reads as ``None``.

On CPU (or without nvidia-ml-py) the host path reads psutil: the hottest CPU sensor, the current
CPU frequency, CPU utilization and this process's resident memory; power is not read.

:class:`ReplayNvml` replays a fixture recorded with ``python -m trainledger.verify.telemetry
record FILE`` (the raw return value of every call, per sample), so the NVML path runs in tests
without a GPU. Never imports torch.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

#: nvmlClocksThrottleReason* bits (nvml.h). The four marked "slowdown" cost clock speed under load.
THROTTLE_REASONS: dict[int, str] = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting",
}
#: throttle reasons a soak counts as a failure (thermal or power-brake slowdowns, hardware slowdown).
SLOWDOWN_REASONS = ("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")

#: nvml.h constants (used when the module lacks the name, e.g. a replayed fixture).
_C = {"NVML_TEMPERATURE_GPU": 0, "NVML_CLOCK_SM": 1, "NVML_MEMORY_ERROR_TYPE_CORRECTED": 0,
      "NVML_MEMORY_ERROR_TYPE_UNCORRECTED": 1, "NVML_VOLATILE_ECC": 0, "NVML_PCIE_UTIL_TX_BYTES": 0,
      "NVML_PCIE_UTIL_RX_BYTES": 1, "NVML_NVLINK_MAX_LINKS": 18, "nvmlEventTypeXidCriticalError": 8}
#: nvmlNvLinkErrorCounter_t: DL replay, DL recovery, DL CRC flit, DL CRC data.
NVLINK_COUNTERS = (0, 1, 2, 3)
KEYS = ("temperature_c", "clock_mhz", "power_w", "utilization_pct", "throttle", "ecc_uncorrected", "ecc_corrected",
        "xid_events", "nvlink_errors", "pcie_replays", "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s",
        "memory_used_bytes")


def decode_throttle(mask: int | None) -> list[str] | None:
    """Names of the throttle-reason bits set in ``mask`` (None stays None)."""
    if mask is None:
        return None
    return [name for bit, name in THROTTLE_REASONS.items() if mask & bit]


class Sampler:
    """Base: ``sample()`` -> dict of :data:`KEYS`; ``kind`` names the path; ``close()`` releases it."""

    kind = "none"
    device_name: str | None = None

    def sample(self) -> dict[str, Any]:
        return dict.fromkeys(KEYS)

    def close(self) -> None:
        pass


class NvmlSampler(Sampler):
    """One GPU through NVML (``nvml`` is ``pynvml`` or a :class:`ReplayNvml`)."""

    kind = "nvml"

    def __init__(self, nvml: Any, index: int = 0) -> None:
        self.nv = nvml
        nvml.nvmlInit()
        self.h = nvml.nvmlDeviceGetHandleByIndex(index)
        name = self._call("nvmlDeviceGetName", self.h)
        self.device_name = name.decode() if isinstance(name, bytes) else name
        self.events = None
        try:
            self.events = nvml.nvmlEventSetCreate()
            nvml.nvmlDeviceRegisterEvents(self.h, self._k("nvmlEventTypeXidCriticalError"), self.events)
        except Exception:  # noqa: BLE001 - events not supported (e.g. some virtualized GPUs)
            self.events = None
        self.xids: list[int] = []

    def _k(self, name: str) -> int:
        return getattr(self.nv, name, _C[name])

    def _call(self, fn: str, *args: Any) -> Any:
        try:
            return getattr(self.nv, fn)(*args)
        except Exception:  # noqa: BLE001 - NVMLError_NotSupported and friends: no reading
            return None

    def _xid(self) -> int | None:
        if self.events is None:
            return None
        while True:
            try:
                data = self.nv.nvmlEventSetWait_v2(self.events, 0)
            except Exception:  # noqa: BLE001 - NVMLError_Timeout: no pending event
                return len(self.xids)
            self.xids.append(int(getattr(data, "eventData", 0)))

    def _nvlink(self) -> int | None:
        total, seen = 0, False
        for link in range(self._k("NVML_NVLINK_MAX_LINKS")):
            for counter in NVLINK_COUNTERS:
                v = self._call("nvmlDeviceGetNvLinkErrorCounter", self.h, link, counter)
                if v is not None:
                    total, seen = total + int(v), True
            if not seen:
                return None  # no NVLink (PCIe card): stop at the first link
        return total

    def sample(self) -> dict[str, Any]:
        c, h, k = self._call, self.h, self._k
        util = c("nvmlDeviceGetUtilizationRates", h)
        power = c("nvmlDeviceGetPowerUsage", h)
        mem = c("nvmlDeviceGetMemoryInfo", h)
        tx = c("nvmlDeviceGetPcieThroughput", h, k("NVML_PCIE_UTIL_TX_BYTES"))
        rx = c("nvmlDeviceGetPcieThroughput", h, k("NVML_PCIE_UTIL_RX_BYTES"))
        return {
            "temperature_c": c("nvmlDeviceGetTemperature", h, k("NVML_TEMPERATURE_GPU")),
            "clock_mhz": c("nvmlDeviceGetClockInfo", h, k("NVML_CLOCK_SM")),
            "power_w": None if power is None else power / 1000.0,
            "utilization_pct": None if util is None else getattr(util, "gpu", None),
            "throttle": decode_throttle(c("nvmlDeviceGetCurrentClocksThrottleReasons", h)),
            "ecc_uncorrected": c("nvmlDeviceGetTotalEccErrors", h, k("NVML_MEMORY_ERROR_TYPE_UNCORRECTED"),
                                 k("NVML_VOLATILE_ECC")),
            "ecc_corrected": c("nvmlDeviceGetTotalEccErrors", h, k("NVML_MEMORY_ERROR_TYPE_CORRECTED"),
                               k("NVML_VOLATILE_ECC")),
            "xid_events": self._xid(), "nvlink_errors": self._nvlink(),
            "pcie_replays": c("nvmlDeviceGetPcieReplayCounter", h),
            "pcie_tx_bytes_per_s": None if tx is None else tx * 1024.0,
            "pcie_rx_bytes_per_s": None if rx is None else rx * 1024.0,
            "memory_used_bytes": None if mem is None else getattr(mem, "used", None),
        }

    def close(self) -> None:
        if self.events is not None:
            self._call("nvmlEventSetFree", self.events)
        self._call("nvmlShutdown")


class HostSampler(Sampler):
    """The host through psutil: hottest CPU sensor, CPU frequency, CPU utilization, process RSS."""

    kind = "host"

    def __init__(self) -> None:
        import platform

        import psutil

        self.ps = psutil
        self.proc = psutil.Process(os.getpid())
        psutil.cpu_percent(None)  # prime the utilization counter
        self.device_name = platform.processor() or platform.machine()

    def _temperature(self) -> float | None:
        read = getattr(self.ps, "sensors_temperatures", None)
        try:
            temps = read() if read else {}
        except (OSError, RuntimeError):
            return None
        vals = [t.current for entries in temps.values() for t in entries if t.current]
        return max(vals) if vals else None

    def sample(self) -> dict[str, Any]:
        out = dict.fromkeys(KEYS)
        try:
            freq = self.ps.cpu_freq()
        except (OSError, RuntimeError, NotImplementedError):
            freq = None
        out.update(temperature_c=self._temperature(), clock_mhz=freq.current if freq and freq.current else None,
                   utilization_pct=self.ps.cpu_percent(None), memory_used_bytes=self.proc.memory_info().rss)
        return out


def open_sampler(device: str, index: int = 0, fixture: str | None = None) -> Sampler:
    """NVML for ``device == "cuda"`` (or a replayed fixture), else the host; never raises."""
    if fixture:
        return NvmlSampler(ReplayNvml.load(fixture), index)
    if device == "cuda":
        try:
            import pynvml

            return NvmlSampler(pynvml, index)
        except Exception:  # noqa: BLE001 - no nvidia-ml-py or no driver: fall back to the host
            pass
    try:
        return HostSampler()
    except Exception:  # noqa: BLE001 - no psutil
        return Sampler()


# ------------------------------------------------------------------------------- fixtures
#: the calls a fixture records per sample (name -> the args after the handle, as constant names).
RECORDED: dict[str, tuple[str, ...]] = {
    "nvmlDeviceGetTemperature": ("NVML_TEMPERATURE_GPU",), "nvmlDeviceGetClockInfo": ("NVML_CLOCK_SM",),
    "nvmlDeviceGetPowerUsage": (), "nvmlDeviceGetUtilizationRates": (),
    "nvmlDeviceGetCurrentClocksThrottleReasons": (), "nvmlDeviceGetPcieReplayCounter": (),
    "nvmlDeviceGetMemoryInfo": (),
}


def _key(fn: str, args: tuple) -> str:
    return fn + "".join(f":{a}" for a in args)


class ReplayNvml:
    """A stand-in for ``pynvml`` that answers from a recorded fixture, one sample per read round.

    Fixture: ``{"device": name, "samples": [{call[:arg...]: value | {"error": "NotSupported"}}]}``;
    objects (utilization, memory) are stored as dicts of their fields. A round ends when the
    temperature is read (the first call of :meth:`NvmlSampler.sample`), so every ``sample()``
    reads the next recorded sample; past the end the last sample repeats.
    """

    class NVMLError(Exception):
        pass

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        self.samples = data["samples"]
        self.i = -1
        self.xid_queue = [x for s in self.samples for x in s.get("xid", [])]

    @classmethod
    def load(cls, path: str | Path) -> ReplayNvml:
        return cls(json.loads(Path(path).read_text()))

    def _get(self, key: str) -> Any:
        s = self.samples[min(max(self.i, 0), len(self.samples) - 1)]
        if key not in s:
            raise self.NVMLError(f"{key}: not recorded (NotSupported)")
        v = s[key]
        if isinstance(v, dict) and "error" in v:
            raise self.NVMLError(v["error"])
        return type("Obj", (), v)() if isinstance(v, dict) else v

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, h: int) -> str:
        return self.data.get("device", "recorded GPU")

    def nvmlEventSetCreate(self) -> str:
        return "events"

    def nvmlDeviceRegisterEvents(self, h: int, kind: int, events: Any) -> None:
        pass

    def nvmlEventSetWait_v2(self, events: Any, timeout_ms: int) -> Any:
        seen = sum(len(s.get("xid", [])) for s in self.samples[: self.i + 1])
        delivered = getattr(self, "_delivered", 0)
        if delivered < seen:
            self._delivered = delivered + 1
            return type("Evt", (), {"eventData": self.xid_queue[delivered]})()
        raise self.NVMLError("Timeout")

    def nvmlEventSetFree(self, events: Any) -> None:
        pass

    def __getattr__(self, fn: str) -> Any:
        if fn in _C:
            return _C[fn]
        if not fn.startswith("nvml"):
            raise AttributeError(fn)

        def call(h: int, *args: Any) -> Any:
            if fn == "nvmlDeviceGetTemperature":
                self.i += 1  # a new sample round
            return self._get(_key(fn, args))
        return call


def record_fixture(path: str | Path, samples: int = 10, interval_s: float = 1.0, index: int = 0) -> dict[str, Any]:
    """Record raw NVML answers of GPU ``index`` into a fixture for :class:`ReplayNvml` (needs a GPU)."""
    import pynvml

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(index)
    name = pynvml.nvmlDeviceGetName(h)

    def grab(fn: str, *args: Any) -> Any:
        try:
            v = getattr(pynvml, fn)(h, *args)
        except pynvml.NVMLError as exc:
            return {"error": str(exc)}
        if hasattr(v, "_fields_"):
            return {f[0]: getattr(v, f[0]) for f in v._fields_}
        return v

    out: list[dict[str, Any]] = []
    for _ in range(samples):
        s: dict[str, Any] = {}
        for fn, names in RECORDED.items():
            args = tuple(getattr(pynvml, n) for n in names)
            s[_key(fn, args)] = grab(fn, *args)
        for kind in ("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_MEMORY_ERROR_TYPE_CORRECTED"):
            args = (getattr(pynvml, kind), pynvml.NVML_VOLATILE_ECC)
            s[_key("nvmlDeviceGetTotalEccErrors", args)] = grab("nvmlDeviceGetTotalEccErrors", *args)
        for d in (pynvml.NVML_PCIE_UTIL_TX_BYTES, pynvml.NVML_PCIE_UTIL_RX_BYTES):
            s[_key("nvmlDeviceGetPcieThroughput", (d,))] = grab("nvmlDeviceGetPcieThroughput", d)
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            for counter in NVLINK_COUNTERS:
                s[_key("nvmlDeviceGetNvLinkErrorCounter", (link, counter))] = grab(
                    "nvmlDeviceGetNvLinkErrorCounter", link, counter)
        out.append(s)
        time.sleep(interval_s)
    pynvml.nvmlShutdown()
    data = {"device": name.decode() if isinstance(name, bytes) else name,
            "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "samples": out}
    Path(path).write_text(json.dumps(data, indent=1))
    return data


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2 or argv[0] != "record":
        print("usage: python -m trainledger.verify.telemetry record FILE [SAMPLES] [INTERVAL_S]", file=sys.stderr)
        return 2
    n = int(argv[2]) if len(argv) > 2 else 10
    dt = float(argv[3]) if len(argv) > 3 else 1.0
    data = record_fixture(argv[1], n, dt)
    print(f"recorded {len(data['samples'])} samples of {data['device']} into {argv[1]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
