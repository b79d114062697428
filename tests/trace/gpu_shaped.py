"""A small GPU-shaped Kineto trace document, built event by event.

Why hand-built: the CI machines have no GPU, and the arithmetic over kernel
records (occupancy, waves, gap causes, graph correlation, bytes) needs cases
whose right answers are known by construction. Real GPU captures come from
`benchmarks/trace_capture.py --device cuda` and are checked in under
`tests/data/traces/gpu-*` (the scenario tests run over them when present).
The event layout copies what Kineto writes (`cat`, `args` keys, correlation
ids, `deviceProperties` with Kineto's key names, as an H200 reports them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

H200 = {"id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150_000_000_000, "computeMajor": 9,
        "computeMinor": 0, "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,
        "regsPerBlock": 65536,
        "regsPerMultiprocessor": 65536, "warpSize": 32, "sharedMemPerBlock": 49152,
        "sharedMemPerMultiprocessor": 233472, "numSms": 132, "sharedMemPerBlockOptin": 232448}
BASE_NS = 1_790_000_000_000_000_000
T0 = 1_000_000.0  # µs


@dataclass
class Kernel:
    name: str
    dur: float
    grid: tuple = (132, 1, 1)
    block: tuple = (128, 1, 1)
    registers: int = 32
    shared_memory: int = 0
    dims: list = field(default_factory=lambda: [[1, 2048], [2048, 2048]])
    gap_before: float = 2.0
    """Device idle time before this kernel starts."""
    launch_late: bool = False
    """Launch call ends after the previous kernel ended (the device waits on the host)."""
    split: float = 0.0
    """Duration of a second kernel the same op launches (split-K reduce); 0: none."""


@dataclass
class Builder:
    mode: str = "eager"
    arm_delay: int = 17
    events: list = field(default_factory=list)
    corr: int = 100

    def _x(self, cat, name, ts, dur, **kw):
        e = {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}
        if kw.get("args") is not None:
            e["args"] = kw["args"]
        if "tid" in kw:
            e["tid"] = kw["tid"]
            e["pid"] = 0
        self.events.append(e)
        return e

    def step(self, i: int, t: float, kernels: list[Kernel], phase: str = "timed") -> float:
        """One decode step from host time `t`; returns its end."""
        self._x("user_annotation", f"ProfilerStep#{self.arm_delay - 1 + i}", t - 1, 0)
        start = t
        host, dev = t + 5.0, t + 20.0
        kernels_out = []
        if self.mode == "persistent":
            self._x("user_annotation", "rowgate.graph_run", host - 1, 0)
            self.corr += 1
            self._x("cuda_runtime", "cudaLaunchKernel", host, 3.0,
                    args={"correlation": self.corr})
            self._kernel(Kernel("fill_staging", 1.0), dev, self.corr)
            dev += 2.0
            for k in kernels:
                self.corr += 1
                self._x("cuda_driver", "cuLaunchKernel", host + 4.0, 3.0,
                        args={"correlation": self.corr})
                dev += k.gap_before
                self._kernel(k, dev, self.corr)
                dev += k.dur
            host += 10.0
        elif self.mode == "graph":
            self._x("user_annotation", "rowgate.graph_run", host - 1, 0)
            self.corr += 1
            self._x("cuda_runtime", "cudaGraphLaunch", host, 8.0,
                    args={"correlation": self.corr})
            for k in kernels:
                dev += k.gap_before
                self._kernel(k, dev, self.corr)
                kernels_out.append((k, dev))
                dev += k.dur
            host += 10.0
        else:
            fwd = self._x("user_annotation", "rowgate.forward", host - 1, 0)
            prev_end = dev
            for k in kernels:
                self.corr += 1
                op = self._x("cpu_op", "aten::mm", host, 6.0, args={
                    "Input Dims": k.dims, "Input type": ["c10::BFloat16", "c10::BFloat16"]})
                launch_ts = host + 1.0
                if k.launch_late:
                    launch_ts = max(launch_ts, prev_end + k.gap_before - 3.0)
                    op["ts"] = launch_ts - 1.0
                self._x("cuda_runtime", "cudaLaunchKernel", launch_ts, 3.0,
                        args={"correlation": self.corr})
                begin = max(prev_end + k.gap_before, launch_ts + 3.0)
                self._kernel(k, begin, self.corr)
                kernels_out.append((k, begin))
                prev_end = begin + k.dur
                if k.split:
                    self.corr += 1
                    self._x("cuda_runtime", "cudaLaunchKernel", launch_ts + 3.5, 1.0,
                            args={"correlation": self.corr})
                    reduce = Kernel(f"{k.name}_reduce", k.split, grid=(1, 1, 1))
                    self._kernel(reduce, prev_end + 1.0, self.corr)
                    prev_end += 1.0 + k.split
                host = launch_ts + 5.0
            dev = prev_end
            fwd["dur"] = host - fwd["ts"]
        end = max(host, dev) + 10.0
        self._x("user_annotation", f"rowgate.step#{phase}:{i}", start, end - start)
        for e in self.events:
            if e["name"] == "rowgate.graph_run" and e["dur"] == 0:
                e["dur"] = end - 5 - e["ts"]
            if e["name"].startswith("ProfilerStep#") and e["dur"] == 0:
                e["dur"] = end + 1 - e["ts"]
        return end

    def _kernel(self, k: Kernel, ts: float, corr: int) -> None:
        self._x("kernel", k.name, ts, k.dur, tid=7, args={
            "device": 0, "stream": 7, "correlation": corr, "registers per thread": k.registers,
            "shared memory": k.shared_memory, "grid": list(k.grid), "block": list(k.block),
            "blocks per SM": 1.0, "warps per SM": 4.0, "est. achieved occupancy %": 6})

    def doc(self, steps: list[list[Kernel]], gap_between_steps: float = 50.0) -> dict:
        t = T0
        ends = []
        for i, ks in enumerate(steps):
            t = self.step(i, t, ks) + gap_between_steps
            ends.append(t)
        self._x("user_annotation", "rowgate.range", T0 - 0.5, t - T0)
        return {"schemaVersion": 1, "deviceProperties": [dict(H200)],
                "baseTimeNanoseconds": BASE_NS, "traceEvents": self.events}


def unix_s(ts_us: float) -> float:
    return (ts_us * 1000 + BASE_NS) / 1e9


def stable_clocks(doc: dict, mhz: int = 1980, jitter: int = 0) -> dict:
    rng = next(e for e in doc["traceEvents"] if e["name"] == "rowgate.range")
    lo, hi = unix_s(rng["ts"]), unix_s(rng["ts"] + rng["dur"])
    n = 8
    samples = [{"t": lo + (hi - lo) * k / (n - 1), "sm_clock_mhz": mhz + (jitter if k % 2 else 0),
                "mem_clock_mhz": 3201, "temperature_c": 40} for k in range(n)]
    return {"gpu_index": 0, "period_s": 0.005, "error": "", "max_sm_clock_mhz": 1980,
            "samples": samples}
