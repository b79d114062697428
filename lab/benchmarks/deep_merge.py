"""The deep candidate's merge as a kernel of its own: timing only (issue 19, item 3).

    python3 benchmarks/deep_merge.py --out DIR             (on the GPU: build, check, time)
    python3 benchmarks/deep_merge.py --read DIR/merge.json.gz  (anywhere: the table)

The epilogue (each split's partial store, fence and ticket, the last split's merge) holds a
CTA's slot for 11.4 µs of E5M2's B16x16K time and 13.7 of bf16's (run 61): without it bf16
would be faster than SDPA. Two-sided decode kernels (vLLM's paged attention v2, FlashInfer's
merge_states) merge in a second kernel instead, whose boundary orders the partials with no
fence or ticket in any CTA. split_kv.cu's RG_DEEP_ABLATE=10 build has every split store its
partial and leave; RG_DEEP_MERGE_ENTRY=1 adds the merge kernel (merge_splits_staged's
arithmetic in its order, one CTA a (sequence, head)), so the pair's output is the deep
candidate's bit for bit, which this checks before it times anything.

At B16x16K (GQA 32/8, D128, page 64; E5M2 and bf16), timed interleaved, L2 flushed (the write
flush, as for the bars): the default deep build, the pair (split kernel + merge kernel) on
the default plan and on a 512-token plan, the split kernel alone (no merge: its output is
not the result; the pair's floor), and (bf16) torch SDPA's backends on the same bytes dense.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from pathlib import Path
from typing import Any

from benchmarks.deep_tail import (
    BATCH,
    LENGTH,
    b16_inputs,
    compile_all,
    measure_kvs,
    path_rows,
    sdpa_paths,
    show_rows,
)

REPO = Path(__file__).resolve().parents[1]

REPEATS = 21
BUILDS = {"default": ["RG_UNIT=3"],
          "split": ["RG_UNIT=3", "RG_DEEP_ABLATE=10", "RG_DEEP_MERGE_ENTRY=1"]}
PAIRS = {"pair": (None, False), "pair_pdl": (None, True), "pair_c512": (512, False)}
"""The pairs: name -> (the forced chunk (None: the operator's own plan), whether the merge
launches as a programmatic dependent)."""


class MergeLaunch:
    """The merge kernel of a split plan's workspace, launched on torch's current stream with
    cuLaunchKernelEx; `pdl`: as the split kernel's programmatic dependent (it may start while
    the split grid drains; its griddepcontrol.wait holds the reads until that grid is done)."""

    def __init__(self, cubin: Path, run: Any, pdl: bool) -> None:
        from cuda.bindings import driver

        from rowgate.ops import contract, launch
        from rowgate_lab.ops import split_kv as op

        shape, d = run.shape, driver
        self.run, self.d, self.launch = run, d, launch
        fn = launch.kernel(str(cubin), f"split_kv_merge_d{shape.dim}_g{shape.group}")
        self.func = op._Launcher._function(d, fn)
        names = [p.name for p in contract.PARAMETERS[contract.POINTERS:]]
        scalars = dict(zip(names, run.launcher.scalars))
        self.slots: list[Any] = [ctypes.c_void_p() for _ in range(5)] + [
            ctypes.c_int32(run.launcher.grid[0]), ctypes.c_int32(shape.hkv),
            ctypes.c_int32(int(scalars["chunk"])), ctypes.c_float(float(scalars["v_scale"]))]
        self.array = (ctypes.c_void_p * len(self.slots))(
            *[ctypes.addressof(v) for v in self.slots])
        cfg = d.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = 1, shape.hkv, shape.batch
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = 256, 1, 1
        cfg.sharedMemBytes = 0
        if pdl:
            attr = d.CUlaunchAttribute()
            attr.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            attr.value.programmaticStreamSerializationAllowed = 1
            cfg.attrs, cfg.numAttrs = [attr], 1
        else:
            cfg.numAttrs = 0
        self.cfg = cfg

    def __call__(self, seq_lens: Any, out: Any) -> None:
        r = self.run
        for slot, ptr in zip(self.slots, (seq_lens.data_ptr(), out.data_ptr(), r.ws_acc.data_ptr(),
                                          r.ws_ml.data_ptr(), r.counters.data_ptr())):
            slot.value = ptr
        self.cfg.hStream = self.d.CUstream(self.launch.current_stream(r.index))
        (err,) = self.d.cuLaunchKernelEx(self.cfg, self.func, ctypes.addressof(self.array), 0)
        if err != self.d.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuLaunchKernelEx(merge) failed: {err!r}")


def kv_paths(kv: str, cubins: dict[str, Path], dev: Any, repeats: int) -> dict[str, Any]:
    """One KV dtype: the pair's output against the default's (bit for bit) and float64, then
    the interleaved samples."""
    import torch

    from rowgate.ops import timing
    from rowgate_lab.ops import split_kv as op

    inp, args, exact = b16_inputs(kv, dev)

    def planned(cubin: Path, chunk: int | None = None) -> Any:
        return op.DecodeAttention(*args, max_seq_len=LENGTH, cubin=cubin, k_scale=inp.k_scale,
                                  v_scale=inp.v_scale, variant="deep",
                                  operator=op.SPLIT_KV_DEEP, chunk=chunk)

    default = planned(cubins["default"])
    outs = {n: torch.empty_like(inp.q) for n in ("default", "split", *PAIRS)}
    fns = {"default": functools.partial(default.run, *args, out=outs["default"])}
    plans = {"default": default}
    for name, (chunk, pdl) in PAIRS.items():
        split = planned(cubins["split"], chunk)
        merge = MergeLaunch(cubins["split"], split, pdl)

        def pair(split: Any = split, merge: MergeLaunch = merge, out: Any = outs[name]) -> None:
            split.run(*args, out=out)
            merge(inp.seq_lens, out)

        fns[name], plans[name] = pair, split
        if name == "pair":
            fns["split"] = functools.partial(split.run, *args, out=outs["split"])
            plans["split"] = split
    check: dict[str, Any] = {}
    for name, fn in list(fns.items()):
        try:
            fn()
            torch.cuda.synchronize(dev)
        except RuntimeError as e:  # a launch this driver refuses: recorded, not timed
            check[name] = {"error": str(e)}
            del fns[name]
            continue
        got = outs[name].double()
        err = (got - exact).abs()
        check[name] = {"kernel": plans[name].kernel, "splits": plans[name].plan.splits,
                       "equals_default": bool(torch.equal(outs[name], outs["default"])),
                       "max_abs_err": float(err.max()), "mean_abs_err": float(err.mean())}
    if kv == "bf16":
        fns.update(sdpa_paths(inp.q, dev))
    samples = timing.interleaved(fns, repeats=repeats, device=dev, flush=True)["samples_us"]
    return {"check": check, "samples_us": samples}


def summarize(res: dict[str, Any]) -> dict[str, Any]:
    """Each path's median, its change against the default, its check."""
    return path_rows(res, lambda r, name: {})


def show(rows: dict[str, Any]) -> None:
    show_rows(rows, f"B{BATCH}x{LENGTH // 1024}K deep candidate: the merge in a kernel of its "
                    "own (medians, L2 flushed; `split` alone is not a result)",
              ("splits", "median_us", "vs_default_us", "vs_best_sdpa_pct", "equals_default",
               "max_abs_err"))


def measure(out: Path, repeats: int) -> dict[str, Any]:
    return measure_kvs(compile_all(out, BUILDS), {"builds": BUILDS, "pairs": PAIRS}, kv_paths,
                       repeats)


def main(argv: list[str] | None = None) -> int:
    from benchmarks.deep_trace import bench_exit

    return bench_exit(argv, __doc__, "deep_merge", "merge.json.gz", measure, summarize, show, REPEATS)


if __name__ == "__main__":
    sys.exit(main())
