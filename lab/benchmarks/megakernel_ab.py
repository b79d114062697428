"""The persistent kernel against the strongest conventional baseline on one GPU, in one
call: the probe model, same weights, same prefilled state.

    PYTHONUNBUFFERED=1 PYTHONPATH=. python3 benchmarks/megakernel_ab.py --out DIR \
        --cubins NAME=PATH ... --split-kv-cubin PATH [--variants SET] \
        [--batches 1 8 4] [--repeats 7] [--budget-s 115]

Cubins (built elsewhere with the build gate's flags), by the key a set's rows name: `v2`
the default build (kernels.toml persistent_decode: the FMA GEMV, weight ring); `mma` and
`mmaplain` RG_MK_MMA=1 (tensor-core GEMV tiles, kernels/persistent/gemv_mma.cuh; the ring
within a task); `mma6`, `mma8` and `mma9` the tree's tensor-core build when the set was
written (today kernels.toml persistent_decode_mma: RG_MK_MMA=1 RG_MK_STREAM=1). A variant
whose cubin is not given is skipped (recorded). `--variants mma` (the default) times the
tensor-core GEMV beside the FMA default and the graph-fused baselines; the other sets time
the task list's options (VARIANT_SETS). The sets of the build variants that lost are in git
history with their builds (commit fc06221).

Per batch, every path's decode step from the same state, timed interleaved (rounds in
rotated order, CUDA events over --steps steps, medians of --repeats rounds):
  graph          the reference engine's CUDA graph (the old baseline, now a fallback arm)
  fused-<mode>   mode graph-fused: q|k|v and gate|up GEMMs, split_kv bf16 attention, the
                 layers torch.compile'd with <mode> (none / default /
                 max-autotune-no-cudagraphs), one CUDA graph (lab/rowgate_lab/engines/fused.py)
  mk-<variant>   the persistent kernel (VARIANT_SETS below: task list options, cubin and
                 schedules): the unfused (ABI v1) stages, the fused list (ABI v2 flags),
                 norms and/or merges kept as stages, splits waiting only for their kv head,
                 PREFETCH_L2 tasks, the split plans (one wave, splits sized by the context)
Checks: within a GEMV family (FMA: `v2`; MMA: `mma`, ...) every variant, task list and
schedule gives its family's unfused list's logits bit for bit (the same arithmetic in the
same order; the two families sum in different orders); each path's logits against eager
bf16 (max |d|, argmax); 32 greedy steps of the persistent defaults and the fused baselines
against eager's tokens under the row's near-tie rule (its abi gate's tie_margin,
src/rowgate/engines/divergence.py: exact, tie, or mismatch).
Then one traced launch per schedule of the last variant: the breakdown (counter waits,
GEMV, other ops; lab/rowgate_lab/megakernel/timeline.py). DIR/results.json is rewritten after
every section; a table is printed last.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import megakernel as mk  # noqa: E402  (benchmarks/megakernel.py: probe, prefill, ceiling)

DYN, STATIC = "dynamic", "static"
PINNED = {"silu_out": False, "even_splits": False, "one_wave": False}
"""Builder options that became defaults after the first variant sets (`mma` to `wave`) were
written: a variant that does not name them runs the list those sets timed (`listed`)."""
STAGED = {"fine_deps": False, "fuse_norm": False, "fuse_merge": False}
"""Norms and merges kept as stages: the builder's default list at batch > 1 (at batch 1 it
fuses the norms, docs/perf.md); the variants name their flags, so a default that moves does
not move them."""
NORM_IN = {**STAGED, "fuse_norm": True}
"""The norms in their consumers' prologues, the merges as stages: the b1 default."""
WAVE = {"one_wave": True}
"""At most one attention split task per SM (builder `one_wave`)."""
SILU_OUT = {"silu_out": True}
"""SiLU-mul in the gate|up tiles' epilogue (builder `silu_out`, ABI flag SILU_OUT)."""
EVEN = {"even_splits": True}
"""Attention splits chunked by the context, not the plan (builder `even_splits`, ABI flag
EVEN_SPLITS): another summation order, its own bitwise family."""
DEFAULTS = {**SILU_OUT, **EVEN, **WAVE}
"""The builder's list options (SILU_OUT, EVEN_SPLITS, one wave)."""
MMA_VARIANTS = [  # name, cubin, builder options, schedules
    ("stages", "v2", {"fuse": False}, (DYN,)),
    ("default", "v2", STAGED, (DYN,)),
    ("mma-stages", "mma", {"fuse": False}, (DYN,)),
    ("mma", "mma", STAGED, (DYN, STATIC)),
    ("mma-fused", "mma", {"fine_deps": False}, (DYN,)),
]
"""The tensor-core GEMV (cubin `mma`) beside the FMA default (`v2`, the same task list),
each with its unfused list as the bitwise reference; `mma-fused` was meant to have every
fusion flag but sets only fine_deps False: the builder's defaults keep norms and merges as
stages, so it is `mma`'s list (both timed at 1,192 us; the flags are timed by the `fuse`
set)."""
GREEDY = {"mma": [("mk-default", "v2", STAGED), ("mk-mma", "mma", STAGED)],
          "fuse": [("mk-mma", "mma", STAGED),
                   ("mk-mma-all-in", "mma", {"fine_deps": True, "fuse_norm": True,
                                             "fuse_merge": True})],
          "merge": [("mk-mma6-norm-in", "mma6", NORM_IN),
                    ("mk-mma6-norm-merge-in", "mma6", {**NORM_IN, "fuse_merge": True}),
                    ("mk-mma6", "mma6", STAGED)],
          "ahead": [("mk-mma8-norm-in", "mma8", NORM_IN),
                    ("mk-mma8-norm-in-l2a5", "mma8", {**NORM_IN, "l2_ahead": 5}),
                    ("mk-mma8", "mma8", STAGED)],
          "wave": [("mk-mma8-1w-norm-in", "mma8", {**NORM_IN, **WAVE}),
                   ("mk-mma8-1w", "mma8", {**STAGED, **WAVE}),
                   ("mk-mma8-norm-in", "mma8", NORM_IN)],
          "even": [("mk-even-norm-in", "mma9", {**NORM_IN, **SILU_OUT, **EVEN}),
                   ("mk-even", "mma9", {**STAGED, **SILU_OUT, **EVEN}),
                   ("mk-siluout", "mma9", {**STAGED, **SILU_OUT})],
          "evenwave": [("mk-evenwave-norm-in", "mma9", {**NORM_IN, **SILU_OUT, **EVEN, **WAVE}),
                       ("mk-evenwave", "mma9", {**STAGED, **SILU_OUT, **EVEN, **WAVE}),
                       ("mk-even", "mma9", {**STAGED, **SILU_OUT, **EVEN})],
          "siluout": [("mk-siluout-norm-in", "mma9", {**NORM_IN, **SILU_OUT}),
                      ("mk-siluout", "mma9", {**STAGED, **SILU_OUT}),
                      ("mk-mma9", "mma9", STAGED)],
          "plain": [("mk-evenwave-norm-in", "mma9", {**NORM_IN, **DEFAULTS}),
                    ("mk-evenwave", "mma9", {**STAGED, **DEFAULTS})]}
"""Persistent paths whose 32 greedy steps are checked against eager's (name, cubin,
options)."""
FUSE_VARIANTS = [  # name, cubin, builder options, schedules
    ("mma-stages", "mma", {"fuse": False}, (DYN,)),
    ("mma", "mma", STAGED, (DYN,)),
    ("mma-norm-in", "mma", NORM_IN, (DYN,)),
    ("mma-merge-in", "mma", {**STAGED, "fuse_merge": True}, (DYN,)),
    ("mma-all-in", "mma", {"fine_deps": True, "fuse_norm": True, "fuse_merge": True}, (DYN,)),
]
"""The serial single-block stages out of the critical path. The `mma` set's breakdown at
b1: each RMS norm is one task on one SM (6.3 us) that all 128 tiles of the next GEMV wait
for, twice a layer; NORM_IN / MERGE_IN (ABI v2 flags) renormalise / merge in every consumer
tile's prologue instead. Measured with the FMA GEMV only before this set (slower there: the
prologue every tile redoes cost more than the stage); `mma-fused` of the `mma` set never
set them (the builder's defaults keep norms and merges as stages)."""
MERGE_VARIANTS = [  # name, cubin, builder options, schedules
    ("mma-stages", "mma", {"fuse": False}, (DYN,)),
    ("mma-norm-in", "mma", NORM_IN, (DYN,)),
    ("mma6-stages", "mma6", {"fuse": False}, (DYN,)),
    ("mma6", "mma6", STAGED, (DYN,)),
    ("mma6-norm-in", "mma6", NORM_IN, (DYN,)),
    ("mma6-merge-in", "mma6", {**STAGED, "fuse_merge": True}, (DYN,)),
    ("mma6-norm-merge-in", "mma6", {**NORM_IN, "fuse_merge": True}, (DYN,)),
    ("mma6-all-in", "mma6", {"fine_deps": True, "fuse_norm": True, "fuse_merge": True}, (DYN,)),
]
"""The latency of the small serial steps. The `fuse` set's breakdown at b1: a merge task
(one per sequence and kv head, on the critical path of every layer) ran 4.8 us for 2 heads
x 128 values, because each of its threads loaded the splits' m, then l and acc, one
dependent L2 round trip after the other (2 x 22 splits); MERGE_IN's prologue the same per
o_proj tile, and a norm one round trip per element. `mma6` (the tree's kernel when this set
was written) loads every split's m, then every l, at once, skips the zero-weight splits and
issues the loads 8 at a time before their sums (kernels/persistent/attention_split.cuh,
split_weights and merged), and the norms load 8 elements ahead: the same arithmetic in the
same order, so `mma6` must give `mma`'s logits bit for bit (the family check compares every
variant with `mma-stages`, built from the previous kernel)."""
AHEAD_VARIANTS = [  # name, cubin, builder options, schedules
    ("mma-stages", "mma", {"fuse": False}, (DYN,)),
    ("mma8-stages", "mma8", {"fuse": False}, (DYN,)),
    ("mma8", "mma8", STAGED, (DYN,)),
    ("mma8-norm-in", "mma8", NORM_IN, (DYN,)),
    ("mma8-norm-in-l2a3", "mma8", {**NORM_IN, "l2_ahead": 3}, (DYN,)),
    ("mma8-norm-in-l2a5", "mma8", {**NORM_IN, "l2_ahead": 5}, (DYN,)),
    ("mma8-norm-in-l2a8", "mma8", {**NORM_IN, "l2_ahead": 8}, (DYN,)),
    ("mma8-l2a5", "mma8", {**STAGED, "l2_ahead": 5}, (DYN,)),
]
"""The traced stages at b1 before this set (66 us a layer): q|k|v 9.1 us, splits 13.1,
merge 7.1, o 3.4, gate|up 19.4, down 12.4 -- the windows add up to the layer, each stage
waits for the one before; a task's run holds ~2.5 us besides its work (the queue claim's
round trip before its signal, 19 of 22 splits an empty-state task of 3 us). `mma8` (the
tree's kernel when this set was written) signals before it claims, writes an empty split's
m and l only (a merge never reads the acc of a zero-weight split), and requests 2 granules
of SILU_IN's gate and up at a time; bit for bit `mma`'s logits (the family check against
`mma-stages`, the previous kernel). `l2aN`: PREFETCH_L2 tasks after each layer's attention
ask L2 for N eighths of every gate|up tile (the blocks done with their splits issue them
while DRAM idles: the attention phase is ~20 us of the layer); a hint, so the same
logits."""
WAVE_VARIANTS = [  # name, cubin, builder options, schedules
    ("mma-stages", "mma", {"fuse": False}, (DYN,)),
    ("mma8-norm-in", "mma8", NORM_IN, (DYN,)),
    ("mma8", "mma8", STAGED, (DYN,)),
    ("mma8-1w-stages", "mma8", {"fuse": False, **WAVE}, (DYN,)),
    ("mma8-1w-norm-in", "mma8", {**NORM_IN, **WAVE}, (DYN,)),
    ("mma8-1w", "mma8", {**STAGED, **WAVE}, (DYN,)),
    ("mma8-1w-fine-norm-in", "mma8", {**NORM_IN, **WAVE, "fine_deps": True}, (DYN,)),
]
"""The attention phase (the `ahead` set at b1: splits 12.5 us, merge 6 us of a 65 us layer;
split_kv does both in 6.5 us in the baseline's graph). Split tasks are now emitted
split-major (every kv head's token-bearing first splits in the first wave; the same
logits, so `mma8-norm-in` is bitwise `mma-stages` still); `1w`: at most one split task per
SM (`one_wave`: b1 16 splits of 64 tokens instead of 22 of 48, b4 4 x 256 instead of
6 x 192, b8 2 x 512 instead of 4 x 336): another chunking, so its own bitwise family
(`mma8-1w-stages`)."""
LATENCY_BASE = [  # name, cubin, builder options, schedules
    ("mma-stages", "mma", {"fuse": False}, (DYN,)),
    ("mma9-norm-in", "mma9", NORM_IN, (DYN,)),
    ("mma9", "mma9", STAGED, (DYN,)),
]
"""What a set times its lists beside: the unfused list (every list's bits), and the tree's
kernel with the norms in and staged."""
SILU_OUT_VARIANTS = [*LATENCY_BASE,
    ("siluout-norm-in", "mma9", {**NORM_IN, **SILU_OUT}, (DYN,)),
    ("siluout", "mma9", {**STAGED, **SILU_OUT}, (DYN, STATIC)),
    ("siluout-fine", "mma9", {**STAGED, **SILU_OUT, "fine_deps": True}, (DYN,)),
]
"""The SiLU once an element. A b8 down tile's prologue was 20.6 us, 11.7 of it the IEEE
SiLU each of the ~128 down tiles redoes over the whole batch x intermediate input (timed
against diagnostic builds with a fast-intrinsic SiLU and none; more granules in flight were
no faster). `siluout` (the list option; the same kernel): each gate|up tile takes the same
rows of both weights and stores SiLU(gate) * up in its epilogue (SILU_OUT), and a down tile
stages that plain. The same values in the same roundings: every list bitwise
`mma-stages`."""
EVEN_VARIANTS = [
    ("mma-stages", "mma", {"fuse": False}, (DYN,)),
    ("siluout-norm-in", "mma9", {**NORM_IN, **SILU_OUT}, (DYN,)),
    ("siluout", "mma9", {**STAGED, **SILU_OUT}, (DYN,)),
    ("even-stages", "mma", {"fuse": False, **EVEN}, (DYN,)),
    ("even-norm-in", "mma9", {**NORM_IN, **SILU_OUT, **EVEN}, (DYN,)),
    ("even", "mma9", {**STAGED, **SILU_OUT, **EVEN}, (DYN, STATIC)),
    ("even-fine", "mma9", {**STAGED, **SILU_OUT, **EVEN, "fine_deps": True}, (DYN,)),
]
"""The attention phase at short contexts. The `siluout` lists at b8: the split window is
21.7 of a 83 us layer; the plan is for 1024 positions (4 splits of 336 tokens), so the
benchmark's 129-token contexts sit in one split a (sequence, kv head), 17 tokens a warp
one after the other, beside 3 empty ones. `even` (EVEN_SPLITS): each split takes
ceil(len / splits) tokens (at least 16): 33 at b8, 22 at b4, 16 at b1. Its own family:
bitwise `even-stages`, not `mma-stages`."""
EVEN_WAVE_VARIANTS = [
    ("even-stages", "mma", {"fuse": False, **EVEN}, (DYN,)),
    ("even-norm-in", "mma9", {**NORM_IN, **SILU_OUT, **EVEN}, (DYN,)),
    ("even", "mma9", {**STAGED, **SILU_OUT, **EVEN}, (DYN,)),
    ("evenwave-stages", "mma", {"fuse": False, **EVEN, **WAVE}, (DYN,)),
    ("evenwave-norm-in", "mma9", {**NORM_IN, **SILU_OUT, **EVEN, **WAVE}, (DYN,)),
    ("evenwave", "mma9", {**STAGED, **SILU_OUT, **EVEN, **WAVE}, (DYN,)),
]
"""One wave of split tasks now that splits are sized by the context. The `even` lists at
b1: 176 split tasks a layer (8 kv heads x 22 planned splits) on 132 SMs, two waves; the
split window 7.3 us where a split takes 3.1. The `wave` set's `one_wave` (at most one split
task per SM) was 2.4 % slower at b1 because a token-bearing split then held 64 planned
tokens; with EVEN_SPLITS a split holds ceil(len / splits) tokens whatever the plan, so
`evenwave` has 16 splits a kv head at b1 (128 tasks, one wave) of the same 16 tokens,
4 x 33 at b4, 2 x 65 at b8. Its own family (`family_of`: one_wave), bitwise
`evenwave-stages`."""
THIN_WAVE = [
    ("evenwave-stages", "mma", {"fuse": False, **EVEN, **WAVE}, (DYN,)),
    ("evenwave-norm-in", "mma9", {**NORM_IN, **DEFAULTS}, (DYN,)),
    ("evenwave", "mma9", {**STAGED, **DEFAULTS}, (DYN,)),
]
"""The tree's kernel on the default lists (norms in: b1's; staged: b4 / b8's) and their
unfused bitwise reference: the first rows of the `plain` set."""
PLAIN_VARIANTS = [
    *THIN_WAVE,
    ("plain-norm-in", "mmaplain", {**NORM_IN, **DEFAULTS}, (DYN,)),
    ("plain", "mmaplain", {**STAGED, **DEFAULTS}, (DYN,)),
]
"""The tree's kernel (`mma9`: RG_MK_STREAM=1, the ring one stream across a block's tasks,
5 groups where the inputs fit 48 KB) beside the plain ring it replaced (`mmaplain`:
RG_MK_MMA=1 alone) on the default lists (norms in: b1's; staged: b4 / b8's); the stream
measured 2-6 % faster at b1 / b4 / b8 on the H100 (docs/perf.md). Bitwise the same
family."""
VARIANT_SETS = {"mma": MMA_VARIANTS, "fuse": FUSE_VARIANTS, "merge": MERGE_VARIANTS,
                "ahead": AHEAD_VARIANTS, "wave": WAVE_VARIANTS, "siluout": SILU_OUT_VARIANTS,
                "even": EVEN_VARIANTS, "evenwave": EVEN_WAVE_VARIANTS, "plain": PLAIN_VARIANTS}
COMPILE = ["none", "max-autotune-no-cudagraphs"]
"""(`--compile default` adds torch.compile's default mode.)"""
GREEDY_STEPS = 32


def log(*parts) -> None:
    print(*parts, flush=True)


def timed(results: dict, name: str, fn, out: Path):
    t0 = time.time()
    try:
        results[name] = fn()
        log(f"[{name}] ok in {time.time() - t0:.1f}s")
    except Exception:  # noqa: BLE001 - a broken section is recorded, the next one runs
        results[name] = {"error": traceback.format_exc()}
        log(f"[{name}] FAILED in {time.time() - t0:.1f}s\n{traceback.format_exc()}")
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    return results[name]


def fused_engines(info, split_kv_cubin: str, modes: list[str], chunks: list[int]) -> dict:
    """One started graph-fused engine per compile mode and split_kv chunk (0: the
    contract's plan; named `<mode>` or `<mode>-c<chunk>`): weights loaded and fused; each
    compiles at its first graph capture, in the batch sections."""
    from rowgate_lab.engines.fused import FusedEngine

    out = {}
    for mode in modes:
        for chunk in chunks:
            eng = FusedEngine(info.path, device="cuda", dtype="bfloat16", compile_mode=mode,
                              cubin=split_kv_cubin, chunk=chunk or None)
            eng.start()
            out[mode + (f"-c{chunk}" if chunk else "")] = eng
    return out


def kernel_profile(fn, steps: int = 5, top: int = 12) -> dict:
    """Where one path's step goes by kernel: torch.profiler (CUPTI) over `steps` steps,
    the device time and launches per step of its `top` kernels, and the total."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    rows = [(e.key, e.device_time_total / steps, e.count / steps)
            for e in prof.key_averages() if e.device_time_total > 0]
    rows.sort(key=lambda r: -r[1])
    return {"step_device_us": sum(r[1] for r in rows),
            "kernels": [{"name": k[:120], "us": round(us, 2), "per_step": n}
                        for k, us, n in rows[:top]]}


def fused_state(eng, batch: int):
    """mk.prefilled()'s state in the fused cache layout (same prompts, pages and values:
    prefill is the reference engine's, on views of the same weights) and its graphs."""
    from rowgate.engines.qwen3 import DecodeGraphs
    from rowgate_lab.engines.fused import FusedKVCache

    cache, args = mk.prefilled(eng.model, batch, GREEDY_STEPS + 2, cache_cls=FusedKVCache)
    graphs = DecodeGraphs(eng.model)
    graphs.reset(cache)
    return graphs, args


def done_within(seconds: float) -> bool:
    """Whether the queued device work finishes within `seconds` (a persistent kernel whose
    counters never reach their values would otherwise hang the call)."""
    ev = torch.cuda.Event()
    ev.record()
    t0 = time.time()
    while not ev.query():
        if time.time() - t0 > seconds:
            return False
        time.sleep(0.01)
    return True


HANG = {}
"""Set by main: where to write the results before leaving when a launch hangs."""


def persistent_steps(model, cache, batch: int, cubins: dict, variants: list) -> dict:
    """mk-<variant> per schedule: PersistentDecode objects sharing one plan per task list,
    each with its variant's kernel (variants whose cubin is not given are left out)."""
    from rowgate.ops.launch import kernel
    from rowgate_lab.megakernel.abi import Schedule
    from rowgate_lab.ops.megakernel import DYNAMIC_SMEM, ENTRY, PersistentDecode, _allow_dynamic_smem

    plans: dict[str, PersistentDecode] = {}
    steps = {}
    for name, cub, options, schedules in variants:
        if cub not in cubins:
            continue
        key = json.dumps(listed(options), sort_keys=True)
        if key not in plans:
            plans[key] = PersistentDecode(model, cache, batch, Schedule.DYNAMIC_QUEUE,
                                          Path(cubins[cub]), options=listed(options))
        for sched in schedules:
            schedule = Schedule.STATIC_ROUND_ROBIN if sched == STATIC else Schedule.DYNAMIC_QUEUE
            pd = copy.copy(plans[key])  # same buffers and task list, this variant's kernel
            pd.schedule = schedule
            pd.fn = kernel(str(cubins[cub]), ENTRY[schedule])
            _allow_dynamic_smem(pd.fn, DYNAMIC_SMEM, 0)
            suffix = ":static" if sched == STATIC else ""
            steps[f"mk-{name}{suffix}"] = pd
            pd.step.stage(*HANG["args"])
            pd.sync.zero_()
            pd.launch()
            if not done_within(10.0):  # record and leave: the device is stuck
                HANG["results"][f"b{batch}"] = {"hang": f"mk-{name}{suffix} did not finish"}
                HANG["write"]()
                log(f"mk-{name}{suffix} at batch {batch} did not finish in 10 s: stopping")
                os._exit(3)
    return steps


def time_modes(fns: dict, steps: int, repeats: int) -> dict[str, list[float]]:
    names = list(fns)
    samples = {m: [] for m in names}
    for r in range(repeats):
        k = r % len(names)
        for m in names[k:] + names[:k]:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(steps):
                fns[m]()
            end.record()
            end.synchronize()
            samples[m].append(start.elapsed_time(end) * 1e3 / steps)
    return samples


ALTERNATIVES = 4
"""Alternatives kept per token, as the reference engine keeps them (bf16 ties 3 ways)."""


def greedy(fn_step, args, steps: int) -> list:
    """`steps` greedy tokens per sequence from the prefilled state (each path on its own
    cache; the caller hands a fresh one), as rowgate.engines.divergence.Out: the tokens, their
    log-probabilities and the ALTERNATIVES most likely tokens at each step."""
    from rowgate.engines.divergence import Out
    from rowgate.engines.qwen3 import PAGE_SIZE

    ids, pos, slots, tables, lens = args
    toks, lps, alts = [], [], []
    for _ in range(steps):
        logp = torch.log_softmax(fn_step(ids, pos, slots, tables, lens).float(), -1)
        ids = logp.argmax(-1)
        top = logp.topk(ALTERNATIVES, -1)
        toks.append(ids.tolist())
        lps.append(logp.gather(-1, ids[:, None])[:, 0].tolist())
        alts.append([list(zip(i, v)) for i, v in zip(top.indices.tolist(), top.values.tolist())])
        pos, lens = pos + 1, lens + 1
        slots = torch.tensor([t[int(p) // PAGE_SIZE] * PAGE_SIZE + int(p) % PAGE_SIZE
                              for t, p in zip(tables.tolist(), pos.tolist())], device=ids.device)
    return [Out(tuple(s[b] for s in toks), tuple(s[b] for s in lps),
                tuple(tuple(s[b]) for s in alts)) for b in range(len(toks[0]))]


def against_eager(want: list, got: list, margin: float, name: str) -> dict:
    """The row's rule per sequence: exact, a near-tie within `margin` nats, or a mismatch."""
    from rowgate.engines.divergence import compare

    return compare(want, got, margin, ("eager", name))


def row_tie_margin() -> float:
    """The megakernel row's abi gate tie_margin (its near-tie rule for persistent vs eager)."""
    import tomllib

    row = tomllib.loads((REPO.parent / "rows" / "KERNEL-CUDA-DECODE-MEGAKERNEL.toml").read_text())
    return float(next(g for g in row["gates"] if g["kind"] == "abi").get("tie_margin", 0.0))


def listed(options: dict) -> dict:
    """A variant's builder options with the PINNED ones it does not name."""
    return {**PINNED, **options}


def family_of(cub: str, options: dict) -> tuple[str, bool, bool, int]:
    """What fixes a path's bits: its GEMV family (the summation order) and its split plan
    (`one_wave`, `even_splits` and `kv_splits` chunk the attention differently)."""
    options = listed(options)
    return ("mma" if cub.startswith("mma") else "fma", bool(options.get("one_wave")),
            bool(options["even_splits"]), int(options.get("kv_splits") or 0))


def bitwise(variants: list, logits: dict) -> dict:
    """Each persistent path against its family's unfused list (the first `fuse: False`
    variant of its family_of): {path: {"ref": name, "equal": bool}}."""
    family = {}
    for name, cub, options, _ in variants:
        if options.get("fuse") is False and f"mk-{name}" in logits:
            family.setdefault(family_of(cub, options), f"mk-{name}")
    out = {}
    for name, cub, options, schedules in variants:
        ref = family.get(family_of(cub, options))
        for sched in schedules:
            n = f"mk-{name}" + (":static" if sched == STATIC else "")
            if n in logits and ref is not None:
                out[n] = {"ref": ref, "equal": bool(torch.equal(logits[n], logits[ref]))}
    return out


def batch_section(model, fused: dict, cubins: dict, batch: int, ns, ceiling: float,
                  deadline: float) -> dict:
    from rowgate.engines.qwen3 import DecodeGraphs
    from rowgate_lab.megakernel import timeline
    from rowgate_lab.megakernel.abi import Schedule
    from rowgate_lab.ops.megakernel import PersistentDecode

    weight_bytes = sum(t.numel() * t.element_size() for k, t in model.w.items()
                       if k != "model.embed_tokens.weight")
    cache, args = mk.prefilled(model, batch, GREEDY_STEPS + 2)
    rec: dict = {"weight_bytes": weight_bytes}
    with torch.inference_mode():
        graphs = DecodeGraphs(model)
        graphs.reset(cache)
        fns = {"eager": lambda: model.decode(*args, cache), "graph": lambda: graphs.run(*args)}
        for mode, eng in fused.items():
            if mode.startswith("max-autotune") and time.time() > deadline:
                rec[f"fused-{mode}"] = "skipped: out of the run's time budget"
                continue
            t0 = time.time()
            try:
                g, fargs = fused_state(eng, batch)
                g.run(*fargs)  # capture (and compile) now, outside the timed rounds
            except Exception:  # noqa: BLE001 - recorded; the other paths still run
                rec[f"fused-{mode}-error"] = traceback.format_exc()[-3000:]
                continue
            rec[f"fused-{mode}-setup_s"] = round(time.time() - t0, 1)
            fns[f"fused-{mode}"] = (lambda g=g, a=fargs: g.run(*a))
        t0 = time.time()
        HANG["args"] = args
        variants = VARIANT_SETS[ns.variants]
        steps = persistent_steps(model, cache, batch, cubins, variants)
        rec["variants_skipped"] = sorted({f"{n} (no cubin {c!r})" for n, c, _, _ in variants
                                          if c not in cubins})
        rec["persistent_setup_s"] = round(time.time() - t0, 1)
        rec["plans"] = {n: pd.plan.summary() for n, pd in steps.items()}
        for n, pd in steps.items():
            fns[n] = (lambda pd=pd: pd(*args))
        # one step of each from the same state: bit for bit across persistent variants
        logits = {n: f() for n, f in fns.items()}
        want = logits["eager"]
        rec["bitwise"] = bitwise(variants, logits)
        rec["vs_eager"] = {n: {"max_abs": float((v - want).abs().max()),
                               "argmax_equal": v.argmax(-1).tolist() == want.argmax(-1).tolist()}
                           for n, v in logits.items()}
        for f in fns.values():
            f()
        torch.cuda.synchronize()
        samples = time_modes({n: f for n, f in fns.items() if n != "eager"}, ns.steps,
                             ns.repeats)
        rec["modes"] = {}
        for n, s in samples.items():
            med = statistics.median(s)
            rec["modes"][n] = {"samples_us": s, "median_us": med, "min_us": min(s),
                               "max_us": max(s),
                               "copy_fraction": weight_bytes / (med * 1e-6) / ceiling}
        # greedy tokens against eager's, each path on its own freshly prefilled cache
        c0, a0 = mk.prefilled(model, batch, GREEDY_STEPS + 2)
        eager_tokens = greedy(lambda *a: model.decode(*a, c0), a0, GREEDY_STEPS)
        margin = row_tie_margin()
        rec["greedy_vs_eager"] = {"tie_margin": margin}
        for name, cub, options in GREEDY[ns.variants]:
            if cub not in cubins:
                continue
            c1, a1 = mk.prefilled(model, batch, GREEDY_STEPS + 2)
            fresh = PersistentDecode(model, c1, batch, Schedule.STATIC_ROUND_ROBIN
                                     if options.get("pad_levels") else Schedule.DYNAMIC_QUEUE,
                                     Path(cubins[cub]), options=listed(options))
            rec["greedy_vs_eager"][name] = against_eager(
                eager_tokens, greedy(fresh, a1, GREEDY_STEPS), margin, name)
        rec["profile"] = {}
        for n in [n for n in fns if n.startswith("fused-")] + ns.profile:
            if n in fns:
                rec["profile"][n] = kernel_profile(fns[n])
        for mode, eng in fused.items():
            if f"fused-{mode}" in fns:
                g, fa = fused_state(eng, batch)
                rec["greedy_vs_eager"][f"fused-{mode}"] = against_eager(
                    eager_tokens, greedy(g.run, fa, GREEDY_STEPS), margin, f"fused-{mode}")
        rec["breakdown"] = {}
        for n in steps:  # every variant's traced breakdown
            pd = steps[n]
            trace = pd.traced(*args)
            torch.cuda.synchronize()
            hz = mk.sm_clock_hz(0)
            rec["breakdown"][n] = {"sm_clock_hz": hz,
                                   **timeline.breakdown(trace, pd.plan.tasks, hz, pd.sm_count)}
    return rec


def table(results: dict) -> None:
    for key, rec in results.items():
        if not key.startswith("b") or not isinstance(rec, dict) or "modes" not in rec:
            continue
        strong = min((v["median_us"] for n, v in rec["modes"].items()
                      if n.startswith("fused-max-autotune")), default=None)
        log(f"--- {key} (x: the strongest baseline's median / this path's; > 1 is faster)")
        for n, v in sorted(rec["modes"].items(), key=lambda kv: kv[1]["median_us"]):
            vs = f"x{strong / v['median_us']:.3f}" if strong else "x-"
            log(f"  {n:28s} {v['median_us']:8.1f} us  [{v['min_us']:.1f}..{v['max_us']:.1f}]  "
                f"{vs:7s} {100 * v['copy_fraction']:5.1f}% of copy  argmax==eager "
                f"{rec['vs_eager'].get(n, {}).get('argmax_equal')}")
        log("  bitwise (vs the family's unfused list): " + ", ".join(
            f"{n} {'==' if b['equal'] else '!='} {b['ref']}" for n, b in rec.get("bitwise", {}).items()))
        for n, g in rec.get("greedy_vs_eager", {}).items():
            if isinstance(g, dict):
                log(f"  greedy vs eager {n}: exact {g['exact_requests']}, near-tie "
                    f"{g['tie_requests']}, mismatched {g['mismatched_requests']} of "
                    f"{g['requests']}")
        for n, b in rec.get("breakdown", {}).items():
            if "wait_fraction" in b:
                log(f"  breakdown {n}: span {b['span_us']:.0f} us, waits "
                    f"{100 * b['wait_fraction']:.1f} %, GEMV {100 * b['gemv_fraction']:.1f} %, "
                    f"other ops {100 * (b['run_fraction'] - b['gemv_fraction']):.1f} %, idle "
                    f"{100 * b['other_fraction']:.1f} %")
                log("    stage windows per layer (us; run/prologue a task): " + ", ".join(
                    f"{k} {s['window_us']:.1f} ({s['run_us']:.1f}/{s['prologue_us']:.1f})"
                    for k, s in b.get("stages", {}).items() if s["layers"] > 1))
        for n, p in rec.get("profile", {}).items():
            log(f"  profile {n}: {p['step_device_us']:.0f} us of kernels a step; top: " +
                "; ".join(f"{k['name'][:40]} {k['us']:.0f}" for k in p["kernels"][:5]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cubins", nargs="+", required=True, help="NAME=PATH (v2, mma, ...)")
    ap.add_argument("--split-kv-cubin", required=True)
    ap.add_argument("--variants", choices=sorted(VARIANT_SETS), default="mma")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 4],
                    help="in this order (b4 last: its max-autotune compile is the one the "
                         "time budget drops first)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--compile", nargs="+", default=COMPILE)
    ap.add_argument("--fused-chunks", type=int, nargs="+", default=[0],
                    help="split_kv chunks of the graph-fused baselines (0: the contract's "
                         "plan); one engine per compile mode and chunk")
    ap.add_argument("--profile", nargs="*", default=[],
                    help="paths profiled by kernel beside the graph-fused ones")
    ap.add_argument("--budget-s", type=float, default=115.0,
                    help="no max-autotune baseline is compiled after this many seconds "
                         "(30-48 s per batch size on the H200; nothing to cache "
                         "across device calls: each starts on a fresh machine)")
    ns = ap.parse_args()
    ns.out.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    torch._dynamo.config.cache_size_limit = 64  # 3 batches x compile modes per stage function
    cubins = dict(c.split("=", 1) for c in ns.cubins)
    dev = torch.device("cuda")
    results: dict = {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
                     "cubins": cubins, "variant_set": ns.variants,
                     "variants": VARIANT_SETS[ns.variants]}
    HANG.update(results=results, write=lambda: (ns.out / "results.json").write_text(
        json.dumps(results, indent=1, default=str) + "\n"))
    ceiling = timed(results, "ceiling", lambda: mk.copy_ceiling(dev), ns.out).get(
        "bytes_per_s", 0.0)
    from rowgate.engines.qwen3 import Qwen3Model, torch_paged_decode_attention

    info = mk.probe()
    model = Qwen3Model(info.path, "cuda", torch.bfloat16, torch_paged_decode_attention)
    engines = timed(results, "fused_engines", lambda: fused_engines(
        info, ns.split_kv_cubin, ns.compile, ns.fused_chunks), ns.out)
    engines = engines if "error" not in engines else {}
    results["fused_engines"] = {m: e.describe() for m, e in engines.items()}
    for batch in ns.batches:
        timed(results, f"b{batch}", lambda b=batch: batch_section(
            model, engines, cubins, b, ns, ceiling, t_start + ns.budget_s), ns.out)
        torch.cuda.empty_cache()  # the batch's caches and plans are gone with its section
    for m, e in engines.items():  # what each engine took, now that its graphs exist
        results["fused_engines"][m] = e.describe()
    results["wall_s"] = round(time.time() - t_start, 1)
    (ns.out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
