"""The reference engine in mode `persistent`: each decode step is one launch of the
persistent megakernel, with the fallback route of `rowgate_lab.megakernel.fallback`.

Everything else (prefill, paged cache, batching, sampling) is the reference
engine's. The step router stands where the engine keeps its CUDA graphs: a
batch the persistent kernel supports runs persistent; any other replays the
CUDA graph (the engine is started in graph mode for that), or runs eagerly
without CUDA. Each batch size's route is recorded and shown by `describe()`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from rowgate.engines.interface import EngineError
from rowgate.engines.reference import ReferenceEngine
from rowgate_lab.megakernel import fallback
from rowgate_lab.megakernel.abi import Schedule

if TYPE_CHECKING:
    from rowgate.engines.qwen3 import DecodeGraphs, PagedKVCache
    from rowgate_lab.ops.megakernel import PersistentSteps


class PersistentEngine(ReferenceEngine):
    name = "reference"

    def __init__(self, model_dir: Path, *, device: str = "cpu", dtype: str = "bfloat16",
                 schedule: str = "dynamic-queue", cubin: str | None = None,
                 nvcc: str | None = None):
        # graph mode underneath: the CUDA graphs are the first fallback
        super().__init__(model_dir, device=device, mode="graph" if device.startswith("cuda")
                         else "eager", dtype=dtype)
        try:
            self.schedule = Schedule.from_row(schedule)
        except KeyError as exc:
            raise EngineError(f"persistent engine: schedule {schedule!r} is not "
                              f"static-round-robin or dynamic-queue") from exc
        self.cubin = cubin
        self.nvcc = nvcc  # an explicitly given nvcc (device machines) for building the cubin
        self.routes: dict[int, fallback.Route] = {}
        self._router: _StepRouter | None = None

    def start(self) -> None:
        super().start()
        self._router = _StepRouter(self)
        self._graphs = self._router  # the engine calls .run/.reset on what stands here

    def stop(self) -> None:
        super().stop()
        self._router = None

    def describe(self) -> dict[str, str]:
        d = super().describe()
        d.update(mode="persistent", schedule=self.schedule.name.lower().replace("_", "-"),
                 persistent_routes=json.dumps({str(b): r.to_json()
                                               for b, r in sorted(self.routes.items())},
                                              sort_keys=True))
        return d

    def _arch(self) -> str:
        if not self.device.startswith("cuda"):
            return ""
        major, minor = torch.cuda.get_device_capability(torch.device(self.device))
        return f"sm_{major}{minor}"


class _StepRouter:
    """Stands in for the engine's `DecodeGraphs`: `run(...)` picks the step's route."""

    def __init__(self, engine: PersistentEngine):
        from rowgate.engines.qwen3 import DecodeGraphs
        from rowgate_lab.ops.megakernel import model_dims

        self.engine = engine
        self.model = engine._live_model  # made by start(), which makes this router
        self.dims = model_dims(self.model)
        self.graphs: DecodeGraphs | None = (DecodeGraphs(self.model)
                                            if engine.device.startswith("cuda") else None)
        self.steps: PersistentSteps | None = None
        self.cache: PagedKVCache | None = None

    def reset(self, cache: PagedKVCache) -> None:
        from rowgate_lab.ops.megakernel import PersistentSteps, build_cubin

        self.cache = cache
        if self.graphs is not None:
            self.graphs.reset(cache)
        arch = self.engine._arch()
        if arch in fallback.ARCHES:
            cubin = Path(self.engine.cubin) if self.engine.cubin else build_cubin(arch, self.engine.nvcc)
            self.steps = PersistentSteps(self.model, cache, self.engine.schedule, cubin)

    def run(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
            tables: torch.Tensor, context_lens: torch.Tensor) -> torch.Tensor:
        batch = ids.shape[0]
        route = self.engine.routes.get(batch)
        if route is None:
            route = fallback.route(self.dims, batch, self.engine.dtype, self.engine.device,
                                   self.engine._arch())
            self.engine.routes[batch] = route
        # reset() made the steps (a persistent arch), the graphs (CUDA) and the cache
        if route.mode == "persistent" and self.steps is not None:
            return self.steps[batch](ids, positions, slots, tables, context_lens)
        if route.mode == "graph" and self.graphs is not None:
            return self.graphs.run(ids, positions, slots, tables, context_lens)
        if route.mode == "eager" and self.cache is not None:
            return self.model.decode(ids, positions, slots, tables, context_lens, self.cache)
        raise EngineError(f"persistent engine: route {route.mode} for batch {batch} before "
                          f"reset() made it")
