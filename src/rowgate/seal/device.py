"""NVML facts about the GPUs on this host, and the launcher prefix for leased ones.

NVML (nvidia-ml-py) is optional: on a machine without a driver `gpus()` is
empty, which the gates turn into PENDING with the reason.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import cache
from types import ModuleType
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict

from rowgate.records.provenance import Gpu


class ClockSample(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    t: float
    sm_clock_mhz: int
    mem_clock_mhz: int
    temperature_c: int


@cache
def _nvml() -> ModuleType | None:
    """The initialised pynvml module, or None where NVML is unusable."""
    try:
        pynvml = importlib.import_module("pynvml")  # typed as a module: pynvml has no types
        pynvml.nvmlInit()
        return pynvml
    except Exception:  # no library, no driver, no device: all mean "no GPU here"
        return None


def nvml_unavailable_reason() -> str:
    try:
        import pynvml
    except ImportError:
        return "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError subclasses per cause
        return f"NVML cannot initialise ({exc})"
    return ""


def gpus() -> list[Gpu]:
    nv = _nvml()
    if nv is None:
        return []
    out = []
    for i in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        major, minor = nv.nvmlDeviceGetCudaComputeCapability(h)
        out.append(Gpu(
            index=i, name=nv.nvmlDeviceGetName(h), arch=f"sm_{major}{minor}",
            uuid=nv.nvmlDeviceGetUUID(h), driver=nv.nvmlSystemGetDriverVersion(),
            memory_total_mib=nv.nvmlDeviceGetMemoryInfo(h).total // (1 << 20),
            sm_clock_mhz=nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
            mem_clock_mhz=nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
            max_sm_clock_mhz=nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM),
            temperature_c=nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)))
    return out


def sample_clocks(index: int, t: float) -> ClockSample:
    nv = _nvml()
    if nv is None:
        raise RuntimeError(f"sample_clocks({index}): NVML is unavailable: "
                           f"{nvml_unavailable_reason()}")
    h = nv.nvmlDeviceGetHandleByIndex(index)
    return ClockSample(t=t, sm_clock_mhz=nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
                       mem_clock_mhz=nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
                       temperature_c=nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))


class GpuChoice(NamedTuple):
    """The GPU a gate runs on: (gpu, is it a stand-in, why none fits: the exact PENDING
    reason, "" when one does or the row is a CPU row)."""

    gpu: Gpu | None
    stand_in: bool
    why_not: str


@dataclass(frozen=True)
class Inventory:
    """The GPUs of this host, enumerated once per run (NVML), and why there are none:
    every choice of a gate's GPU in the run is made from it."""

    gpus: tuple[Gpu, ...] = ()
    why_none: str = "no GPU visible to NVML"

    def select(self, arch: str, selector: str = "any", stand_ins: list[str] | None = None
               ) -> GpuChoice:
        """Pick the GPU a row's execution gates run on; `why_not` is the exact PENDING
        reason when no suitable GPU is here."""
        if arch == "cpu":
            return GpuChoice(None, False, "")
        if not self.gpus:
            return GpuChoice(None, False, f"needs an {arch} device{_named(selector)}; this "
                                          f"host has no GPU ({self.why_none})")
        candidates = [g for g in self.gpus if _matches(g, selector)]
        for g in candidates:
            if g.arch == arch:
                return GpuChoice(g, False, "")
        for g in candidates:
            if g.arch in (stand_ins or []):
                return GpuChoice(g, True, "")
        here = ", ".join(f"{g.name} ({g.arch})" for g in self.gpus)
        return GpuChoice(None, False, f"needs an {arch} device{_named(selector)}; this host "
                                      f"has {here}")


def inventory() -> Inventory:
    """Enumerate this host's GPUs (the one NVML enumeration of a run)."""
    found = gpus()
    return Inventory(tuple(found), "" if found else
                     nvml_unavailable_reason() or "no GPU visible to NVML")


def _named(selector: str) -> str:
    return "" if selector == "any" else f" ({selector})"


def _matches(gpu: Gpu, selector: str) -> bool:
    """`any`; `HOST:gpuN` (index N); `name:TEXT` (TEXT in the device name)."""
    if selector == "any":
        return True
    if selector.startswith("name:"):
        return selector[5:].lower() in gpu.name.lower()
    tail = selector.rsplit(":", 1)[-1]
    if tail.startswith("gpu") and tail[3:].isdigit():
        return gpu.index == int(tail[3:])
    return False


def launcher_prefix(launcher: list[str]) -> list[str]:
    """The row's lease command, used as-is: with a launcher rowgate takes no lock
    of its own (combining `rc` with `flock` deadlocks the site's lease)."""
    return list(launcher)
