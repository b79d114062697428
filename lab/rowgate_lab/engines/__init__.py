"""The lab's engines, registered in rowgate's `rowgate.engines` entry-point group:

* `lab-persistent`: the reference model's decode step as one persistent megakernel
  launch (options `persistent_schedule`, `persistent_cubin`, `nvcc`);
* `lab-graph-fused`: the reference model compiled with torch.compile and replayed as
  a CUDA graph, attention through the lab's split-KV kernel (options `fused_compile`,
  `fused_cubin`, `fused_chunk`, `nvcc`).
"""

from __future__ import annotations

from pathlib import Path

from rowgate.engines import Engine, EnginePlugin, integer
from rowgate.rows.spec import Arm

DEFAULT_SCHEDULE = "dynamic-queue"
"""The persistent engine's schedule without the `persistent_schedule` option."""


def _persistent(arm: Arm, model_dir: Path, device: str, options: dict[str, str],
                subject: Path | None) -> Engine:
    from rowgate_lab.engines.persistent import PersistentEngine

    return PersistentEngine(model_dir, device=device, dtype=arm.dtype,
                            schedule=options.get("persistent_schedule", DEFAULT_SCHEDULE),
                            cubin=options.get("persistent_cubin"), nvcc=options.get("nvcc"))


def _graph_fused(arm: Arm, model_dir: Path, device: str, options: dict[str, str],
                 subject: Path | None) -> Engine:
    from rowgate_lab.engines.fused import COMPILE_MODES, FusedEngine

    return FusedEngine(model_dir, device=device, dtype=arm.dtype,
                       compile_mode=options.get("fused_compile", COMPILE_MODES[0]),
                       cubin=options.get("fused_cubin"), nvcc=options.get("nvcc"),
                       chunk=integer(options, "fused_chunk", 0) or None)


PERSISTENT = EnginePlugin(create=_persistent, in_process=True, modes=("persistent",), options={
    "persistent_schedule": "the persistent engine's schedule (static-round-robin, "
                           "dynamic-queue)",
    "persistent_cubin": "a prebuilt persistent megakernel cubin",
    "nvcc": "path of a CUDA nvcc to build with (its version is recorded)",
})
GRAPH_FUSED = EnginePlugin(create=_graph_fused, in_process=True, modes=("graph-fused",),
                           options={
    "fused_compile": "the graph-fused engine's torch.compile mode (max-autotune-no-cudagraphs "
                     "by default; max-autotune, default, reduce-overhead, none)",
    "fused_cubin": "a prebuilt cubin of the graph-fused engine's decode attention",
    "fused_chunk": "tokens per split of the graph-fused engine's split_kv attention (a "
                   "multiple of 64 up to 512; default: the operator contract's plan)",
    "nvcc": "path of a CUDA nvcc to build with (its version is recorded)",
})
