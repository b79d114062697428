"""NVML facts about the GPUs on this host, and the launcher prefix for leased ones.

NVML (nvidia-ml-py) is optional: on a machine without a driver `gpus()` is
empty, which the gates turn into PENDING with the reason.
"""

from __future__ import annotations

from functools import cache

from pydantic import BaseModel, ConfigDict


class Gpu(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    index: int
    name: str
    arch: str
    """`sm_XY` from the compute capability."""
    uuid: str
    driver: str
    memory_total_mib: int
    sm_clock_mhz: int
    mem_clock_mhz: int
    max_sm_clock_mhz: int
    temperature_c: int


class ClockSample(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    t: float
    sm_clock_mhz: int
    mem_clock_mhz: int
    temperature_c: int


@cache
def _nvml():
    try:
        import pynvml

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
    h = nv.nvmlDeviceGetHandleByIndex(index)
    return ClockSample(t=t, sm_clock_mhz=nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
                       mem_clock_mhz=nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
                       temperature_c=nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))


def select(arch: str, selector: str = "any", stand_ins: list[str] | None = None
           ) -> tuple[Gpu | None, bool, str]:
    """Pick the GPU a row's execution gates run on.

    Returns (gpu, is_stand_in, why_not). `why_not` is the exact PENDING reason
    when no suitable GPU is here.
    """
    if arch == "cpu":
        return None, False, ""
    found = gpus()
    if not found:
        why = nvml_unavailable_reason() or "no GPU visible to NVML"
        return None, False, f"needs an {arch} device{_named(selector)}; this host has no GPU ({why})"
    candidates = [g for g in found if _matches(g, selector)]
    for g in candidates:
        if g.arch == arch:
            return g, False, ""
    for g in candidates:
        if g.arch in (stand_ins or []):
            return g, True, ""
    here = ", ".join(f"{g.name} ({g.arch})" for g in found)
    return None, False, f"needs an {arch} device{_named(selector)}; this host has {here}"


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
