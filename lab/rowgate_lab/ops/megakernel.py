"""One decode step through the persistent megakernel (kernels/persistent/megakernel.cu).

`PersistentDecode(model, cache, batch, schedule)` builds the step's task list
(`rowgate_lab.megakernel.builder`), refuses it unless the host validator accepts
it, and points the buffer table at the model's own weight tensors, the paged
KV cache and one workspace: no weight is copied. Calling it has the signature
of `Qwen3Model.decode` without the cache and returns the logits [batch, vocab]
(fp32 of the bf16-rounded dot products, as the reference computes them).

The cubin is the build gate's (`rowgate.cuda.cudabuild`), or a path given (a device
machine without the build's Python dependencies builds it with its own nvcc).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from rowgate.ops.launch import cuda_core, current_stream, kernel, stream
from rowgate_lab import LAB
from rowgate_lab.megakernel import abi, builder
from rowgate_lab.megakernel.validate import validate

if TYPE_CHECKING:
    import numpy.typing as npt

    from rowgate.engines.qwen3 import PagedKVCache, Qwen3Model

REPO = LAB
KERNEL = "persistent_decode"
ENTRY = {abi.Schedule.STATIC_ROUND_ROBIN: "persistent_decode_static",
         abi.Schedule.DYNAMIC_QUEUE: "persistent_decode_dynamic"}
THREADS = 256
DYNAMIC_SMEM = 224 * 1024
"""The launch's dynamic shared memory: the tensor-core build's kDynamicSmemBytes since it
runs RG_MK_STREAM (a 160 KB ring, a 48 KB staging buffer, and the scratch after both
layouts); the builds without it need 208 KB (staging buffer, scratch and a 96 KB ring). A
kernel traps when launched with less than its own."""


def _allow_dynamic_smem(fn: Any, nbytes: int, device_index: int) -> None:
    """Raise a kernel's dynamic shared memory limit above the default 48 KB."""
    from cuda.bindings import driver

    attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    (err,) = driver.cuKernelSetAttribute(attr, nbytes, driver.CUkernel(int(fn.handle)),
                                         driver.CUdevice(device_index))
    if err != driver.CUresult.CUDA_SUCCESS:  # an older cuda.core hands out a CUfunction
        (err,) = driver.cuFuncSetAttribute(driver.CUfunction(int(fn.handle)), attr, nbytes)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"persistent kernel: cannot allow {nbytes} B of dynamic shared "
                           f"memory: {err!r}")


MMA_KERNEL = "persistent_decode_mma"
"""The tensor-core GEMV build (kernels.toml): the engine's kernel on every arch that
entry targets. On the H200 it is 1.2-2.0x the FMA build at b1-b8 with the same proof
(bitwise across its task lists and schedules, greedy within the row's near-tie rule;
docs/perf.md)."""


def kernel_for(arch: str) -> str:
    """The kernels.toml entry the persistent engine builds for `arch`."""
    from rowgate.cuda import kernels

    mma = kernels.load(REPO).kernels.get(MMA_KERNEL)
    return MMA_KERNEL if mma is not None and arch in mma.arches else KERNEL


def build_cubin(arch: str, nvcc: str | None = None) -> Path:
    from rowgate.cuda import cudabuild

    return cudabuild.cubin(REPO, kernel_for(arch), arch, nvcc)


def model_dims(model: Qwen3Model) -> builder.ModelDims:
    """Dims of a loaded `Qwen3Model` (its config lacks intermediate_size: read the weight)."""
    c = model.cfg
    return builder.ModelDims(vocab=c.vocab_size, hidden=c.hidden_size,
                             intermediate=model.w["model.layers.0.mlp.gate_proj.weight"].shape[0],
                             layers=c.num_layers, heads=c.num_heads, kv_heads=c.num_kv_heads,
                             head_dim=c.head_dim, rms_eps=c.rms_norm_eps,
                             max_position=c.max_position)


class StepBuffers:
    """The buffer table of one planned step bound to tensors, and the step's metadata
    staged into it. Device-independent (the CPU interpreter runs on it too)."""

    def __init__(self, model: Qwen3Model, cache: PagedKVCache, batch: int, sm_count: int,
                 **options: Any):
        self.device = torch.device(model.device)
        self.batch = batch
        self.dims = model_dims(model)
        # options: the builder's (fuse, fine_deps, tile_scale); its defaults otherwise
        self.plan = builder.build_step(self.dims, batch, sm_count, num_blocks=cache.num_blocks,
                                       **options)
        validate(self.plan.tasks, self.plan.shape, self.plan.buffers,
                 self.plan.num_counters).raise_if_bad()
        self.tensors = self._bind(model, cache)
        self.meta = self.tensors[self.plan.shape.meta_buffer]
        self.logits = self.region("logits").view(torch.float32).view(batch, self.dims.vocab)

    def region(self, name: str) -> torch.Tensor:
        r = self.plan.regions[name]
        return self.tensors[r.slot][r.offset:r.offset + r.nbytes]

    def _bind(self, model: Qwen3Model, cache: PagedKVCache) -> list[torch.Tensor]:
        """One tensor per buffer-table slot, each at least the size the plan validated."""
        rope = torch.cat([model.cos, model.sin], dim=-1).contiguous()
        out: list[torch.Tensor] = []
        for b in self.plan.buffers:
            if b.name == "rope.cos_sin":
                t = rope
            elif b.name.startswith(("k_cache.", "v_cache.")):
                kind, layer = b.name.split(".")
                t = (cache.k if kind == "k_cache" else cache.v)[int(layer)]
            elif b.name == "workspace":
                t = torch.zeros(b.size, dtype=torch.uint8, device=self.device)
            elif b.name == "meta":
                t = torch.zeros(b.size // 4, dtype=torch.int32, device=self.device)
            else:
                t = model.w[b.name]
            if t.dtype not in (torch.bfloat16, torch.uint8, torch.int32) or not t.is_contiguous():
                raise ValueError(f"buffer {b.name}: {t.dtype}, contiguous={t.is_contiguous()}; "
                                 f"the persistent kernel reads contiguous bf16")
            if t.numel() * t.element_size() < b.size:
                raise ValueError(f"buffer {b.name}: {t.numel() * t.element_size()} bytes, the "
                                 f"plan reads {b.size}")
            out.append(t)
        return out

    def stage(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
              block_tables: torch.Tensor, context_lens: torch.Tensor) -> None:
        """Write one step's ids, positions, slots, lengths and block tables into meta."""
        s, b = self.plan.shape, self.batch
        if ids.shape[0] != b:
            raise ValueError(f"persistent step planned for batch {b}, got {ids.shape[0]}")
        if block_tables.shape[1] > s.table_width:
            raise ValueError(f"block tables {block_tables.shape[1]} wide, plan holds "
                             f"{s.table_width}")
        meta = self.meta
        meta[s.ids_at:s.ids_at + b] = ids
        meta[s.positions_at:s.positions_at + b] = positions
        meta[s.slots_at:s.slots_at + b] = slots
        meta[s.context_lens_at:s.context_lens_at + b] = context_lens
        tables = meta[s.block_tables_at:s.block_tables_at + b * s.table_width]
        tables.view(b, s.table_width).zero_()[:, :block_tables.shape[1]] = block_tables


class PersistentDecode:
    """A planned persistent decode step for one batch size; reusable across steps."""

    def __init__(self, model: Qwen3Model, cache: PagedKVCache, batch: int,
                 schedule: abi.Schedule, cubin: Path,
                 sm_count: int | None = None, options: dict[str, Any] | None = None):
        dev = torch.device(model.device)
        self.device, self.batch, self.schedule = dev, batch, schedule
        self.sm_count = sm_count or torch.cuda.get_device_properties(dev).multi_processor_count
        self.step = StepBuffers(model, cache, batch, self.sm_count, **(options or {}))
        self.plan = self.step.plan
        ptrs = [t.data_ptr() for t in self.step.tensors]
        self.buffers = torch.tensor(np.array(ptrs, dtype=np.uint64).view(np.int64), device=dev)
        self.tasks = self._upload(abi.pack(self.plan.tasks))
        self.shape = self._upload(abi.pack_shape(self.plan.shape))
        # counters then the queue head, zeroed by one memset per step
        self.sync = torch.zeros(self.plan.num_counters + 1, dtype=torch.int32, device=dev)
        self.fn = kernel(str(cubin), ENTRY[schedule])
        _allow_dynamic_smem(self.fn, DYNAMIC_SMEM, dev.index if dev.index is not None else 0)

    def _upload(self, data: bytes) -> torch.Tensor:
        return torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self.device)

    def __call__(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                 block_tables: torch.Tensor, context_lens: torch.Tensor) -> torch.Tensor:
        self.step.stage(ids, positions, slots, block_tables, context_lens)
        self.sync.zero_()
        self.launch()
        return self.step.logits.clone()

    def launch(self, trace: torch.Tensor | None = None) -> None:
        cc = cuda_core()
        index = self.device.index if self.device.index is not None else 0
        config = cc.LaunchConfig(grid=self.sm_count, block=THREADS, shmem_size=DYNAMIC_SMEM)
        counters = self.sync.data_ptr()
        head = counters + 4 * self.plan.num_counters
        cc.launch(stream(current_stream(index)), config, self.fn, self.tasks.data_ptr(),
                  np.uint32(len(self.plan.tasks)), self.buffers.data_ptr(),
                  self.shape.data_ptr(), counters, head,
                  trace.data_ptr() if trace is not None else 0)

    def traced(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
               block_tables: torch.Tensor, context_lens: torch.Tensor
               ) -> npt.NDArray[np.uint64]:
        """One launch with per-task timing; the raw [tasks, 4] u64 record
        (`rowgate_lab.megakernel.timeline` reads it)."""
        words = len(self.plan.tasks) * 4
        trace = torch.zeros(words, dtype=torch.int64, device=self.device)
        self.step.stage(ids, positions, slots, block_tables, context_lens)
        self.sync.zero_()
        self.launch(trace)
        record: npt.NDArray[np.uint64] = trace.cpu().numpy().view(np.uint64).reshape(-1, 4)
        return record


class PersistentSteps(dict[int, PersistentDecode]):
    """A plan per batch size, made on first use (task lists differ by batch)."""

    def __init__(self, model: Qwen3Model, cache: PagedKVCache, schedule: abi.Schedule,
                 cubin: Path):
        super().__init__()
        self.args = (model, cache, schedule, cubin)

    def __missing__(self, batch: int) -> PersistentDecode:
        self[batch] = PersistentDecode(*self.args[:2], batch, *self.args[2:])
        return self[batch]
