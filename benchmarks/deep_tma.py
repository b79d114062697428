"""The deep candidate with tensor copies (issue 19 item 3; split_kv.cu's RG_DEEP_TMA): E5M2
D128 tiles arrive as one cp.async.bulk.tensor copy each, through tensor maps of the K and V
caches (128-byte swizzle), where the default deep candidate stages each byte through an L1
line with cp.async.ca. One device call:

  build    split_kv.cu's deep unit with RG_DEEP_TMA for each ring depth in STAGES (device nvcc)
  check    `_deept` / `_deeptc` bit for bit against the unit's `_base` on a case matrix
           (groups 4 and 8, pages 16/64/256, lengths with partial tiles and pages, B1x1K and
           B16x16K), beside the default deep candidate
  bench    B16x16K (L2 flushed, rotated order) and B1x1K (graph replay over 48 inputs):
           `_deep` against `_deept` at every depth
  ncu      `--ncu`: the counters of benchmarks/decode_attention.py on B16x16K

The tensor maps are extra kernel parameters after the contract's (`paged-decode-attention/1`
has none), so this script launches `_deept` itself, on the plan, workspace and scalars of a
planned `deep` launch of the same inputs (pipeline/ops/decode_attention.py).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import ctypes
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.decode_attention import NCU_METRICS, deep_ring_bytes, log, median, nvcc_cmd, spread  # noqa: E402
from pipeline.ops import decode_attention as op  # noqa: E402
from pipeline.ops import launch, timing  # noqa: E402
from pipeline.ops.paged_inputs import Case, make_inputs  # noqa: E402

STAGES = (2, 3, 4)
PROBE = REPO / "benchmarks" / "probes" / "paged_read.cu"
ROW = 128  # bytes of an E5M2 D128 token row
TILE = 16


def tma_ring_bytes(stages: int) -> int:
    """split_kv.cu's DeepCfg<E5M2, 128, G, true>::RING: the warps' stages, their mbarriers
    and the 1 KB the ring may move up to reach the swizzle's alignment."""
    return 8 * stages * TILE * ROW + 8 * stages * 8 + 1024


VARIANTS = {"nokv": ["RG_DEEP_ABLATE=2"], "nokv_noepi": ["RG_DEEP_ABLATE=4"],
            "nokv_nopv": ["RG_DEEP_ABLATE=5"], "nokv_noqk": ["RG_DEEP_ABLATE=6"]}
"""Other builds of the deep unit: no K/V copies (timing only: the math on whatever the ring
holds), and tensor copies at two CTAs an SM (128 registers; 3 and 4 stages) for `_deepp`."""
PERSISTENT = {"p3": 3, "p3_grid": 3}
"""(p3_grid: the p3 build launched with one CTA an item, not persistent)"""
"""`_deepp` builds: {name: (the cubin of STAGES or VARIANTS, its ring stages)}."""


def build(nvcc: str, arch: str, out: Path) -> tuple[Path, dict[int | str, Path]]:
    """The deep unit as kernels.toml builds it (the default cubin: `_base`, `_deep`,
    `_deepc`), with RG_DEEP_TMA at each depth, and VARIANTS."""
    jobs: dict[int | str, tuple[Path, list[str]]] = {
        0: (out / f"split_kv.deep.{arch}.cubin", ["RG_UNIT=3"])}
    for s in STAGES:
        jobs[s] = (out / f"split_kv.deept_s{s}.{arch}.cubin",
                   ["RG_UNIT=3", "RG_DEEP_TMA=1", f"RG_DEEP_TMA_STAGES={s}"])
    for name, defines in VARIANTS.items():
        jobs[name] = (out / f"split_kv.deep_{name}.{arch}.cubin", ["RG_UNIT=3", *defines])
    def one(job: tuple[Path, list[str]]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(nvcc_cmd(nvcc, arch, *job), capture_output=True, text=True,
                              timeout=300)

    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        done = dict(zip(jobs, pool.map(one, jobs.values())))
    logs = {s: p.stdout + p.stderr for s, p in done.items()}
    for s, p in done.items():
        if p.returncode:
            raise SystemExit(f"build {jobs[s][1]} failed:\n{p.stderr[-3000:]}")
    (out / "build.log").write_text("\n".join(f"== s{s}\n{t}" for s, t in logs.items()))
    return jobs[0][0], {s: path for s, (path, _) in jobs.items() if s != 0}


class TensorMaps:
    """The K and V caches as [rows, 128 bytes] tensor maps with 16-row boxes and the
    128-byte swizzle (cuda.bindings' cuTensorMapEncodeTiled), copied into 64-byte-aligned
    parameter slots."""

    def __init__(self, k_cache: torch.Tensor, v_cache: torch.Tensor, promotion: int = 256):
        from cuda.bindings import driver as d
        promo = {0: d.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_NONE,
                 128: d.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                 256: d.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B}[promotion]
        rows = k_cache.numel() // ROW
        if rows >= 1 << 31:
            raise ValueError(f"k_cache: {rows} rows, a tensor map's coordinates are int32")
        self._raw = (ctypes.c_uint8 * (3 * 128 + 64))()
        base = (ctypes.addressof(self._raw) + 63) // 64 * 64
        self.addresses = [base, base + 128]
        for i, cache in enumerate((k_cache, v_cache)):
            err, tmap = d.cuTensorMapEncodeTiled(
                d.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, cache.data_ptr(),
                [d.cuuint64_t(ROW), d.cuuint64_t(rows)], [d.cuuint64_t(ROW)],
                [d.cuuint32_t(ROW), d.cuuint32_t(TILE)], [d.cuuint32_t(1), d.cuuint32_t(1)],
                d.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
                d.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
                promo,
                d.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
            if err != d.CUresult.CUDA_SUCCESS:
                raise RuntimeError(f"cuTensorMapEncodeTiled: {err!r}")
            ctypes.memmove(self.addresses[i], tmap.getPtr(), 128)


class TmaLaunch:
    """`_deept` (or `_deeptc`) of `cubin` on the plan of `planned` (a `deep` launch of the
    same inputs): its grid, workspace and scalars, with the ring of `stages` stages."""

    def __init__(self, planned: op.DecodeAttention, cubin: Path, stages: int, inp,
                 promotion: int = 256, persistent: bool = False, one_item: bool = False):
        from cuda.bindings import driver as d
        self.d, self.planned = d, planned
        base = planned.launcher
        group = inp.q.shape[1] // inp.k_cache.shape[1]
        if persistent:  # `_deepp`: ring | scores of the largest chunk | the warps' partials
            self.entry = f"split_kv_e5m2_d128_g{group}_deepp"
            self.smem = tma_ring_bytes(stages) + 512 * group * 4 + 8 * group * 128 * 4
        else:
            self.entry = planned.kernel.replace("_deep", "_deept")
            self.smem = base.smem - deep_ring_bytes("e5m2", 128) + tma_ring_bytes(stages)
        fn = launch.kernel(str(cubin), self.entry)
        self.raw = op._Launcher._function(d, fn)
        attr = d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        (err,) = d.cuFuncSetAttribute(self.raw, attr, self.smem)
        if err != d.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"{self.entry}: dynamic shared memory {self.smem}: {err!r}")
        self.maps = TensorMaps(inp.k_cache, inp.v_cache, promotion)
        self.slots = [t() for t in op._Launcher.TYPES]
        for slot, value in zip(self.slots[len(self.slots) - len(base.scalars):], base.scalars):
            slot.value = value
        extra: list = []
        self.grid, self.block = base.grid, base.block
        if persistent:
            splits, batch = planned.plan.splits, inp.q.shape[0]
            items = splits * inp.k_cache.shape[1] * batch
            err, per_sm = d.cuOccupancyMaxActiveBlocksPerMultiprocessor(self.raw, self.block,
                                                                        self.smem)
            if err != d.CUresult.CUDA_SUCCESS or per_sm < 1:
                raise RuntimeError(f"{self.entry}: occupancy {per_sm} ({err!r})")
            sms = torch.cuda.get_device_properties(inp.q.device).multi_processor_count
            self.grid = (items if one_item else min(items, per_sm * sms), 1, 1)
            self.per_sm = per_sm
            extra = [ctypes.c_int32(splits), ctypes.c_int32(batch)]
        self.extra = extra
        self.array = (ctypes.c_void_p * (len(self.slots) + 2 + len(extra)))(
            *[ctypes.addressof(v) for v in self.slots], *self.maps.addresses,
            *[ctypes.addressof(v) for v in extra])

    def __call__(self, inp, out: torch.Tensor) -> torch.Tensor:
        p = self.planned
        for slot, value in zip(self.slots, (
                inp.q.data_ptr(), inp.k_cache.data_ptr(), inp.v_cache.data_ptr(),
                inp.block_table.data_ptr(), inp.seq_lens.data_ptr(), out.data_ptr(),
                p.ws_acc.data_ptr(), p.ws_ml.data_ptr(), p.counters.data_ptr())):
            slot.value = value
        stream = torch.cuda.current_stream().cuda_stream
        (err,) = self.d.cuLaunchKernel(self.raw, *self.grid, self.block, 1, 1, self.smem, stream,
                                       ctypes.addressof(self.array), 0)
        if err != self.d.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuLaunchKernel {self.entry}: {err!r}")
        return out


def planned(inp, cubin: Path, variant: str, max_len: int) -> op.DecodeAttention:
    return op.DecodeAttention(inp.q, inp.k_cache, inp.v_cache, inp.block_table, inp.seq_lens,
                              max_seq_len=max_len, cubin=cubin, k_scale=inp.k_scale,
                              v_scale=inp.v_scale, variant=variant, operator=op.SPLIT_KV_DEEP)


def cases() -> list[Case]:
    """Groups 4 and 8, pages 16/64/256, lengths with partial tiles, pages and chunks."""
    out = [Case(7, 16, "uniform", "16384", 64, "e5m2", 32, 8, 128, [16384] * 16),
           Case(7, 1, "uniform", "1024", 64, "e5m2", 32, 8, 128, [1024])]
    lens = [[1, 5, 16, 17], [31, 100, 513, 1000], [4097, 2049, 777, 1],
            [16384, 16383, 15, 9000]]
    seed = 20
    for hq in (32, 64):
        for page in (16, 64, 256):
            for ls in lens:
                seed += 1
                out.append(Case(seed, len(ls), "ragged", str(max(ls)), page, "e5m2", hq, 8, 128,
                                ls))
    return out


def tma_variants(inp, cubins: dict[int | str, Path], n: int) -> dict[str, "TmaLaunch"]:
    """`_deept` at each depth and `_deepp` of each PERSISTENT build, planned for `inp`."""
    out = {f"deept_s{s}": TmaLaunch(planned(inp, cubins[s], "deep", n), cubins[s], s, inp)
           for s in STAGES}
    for name, stages in PERSISTENT.items():
        cub = cubins[name if name in cubins else stages]
        out[f"deepp_{name}"] = TmaLaunch(planned(inp, cub, "deep", n), cub, stages, inp,
                                         persistent=True, one_item=name.endswith("_grid"))
    return out


def check(cubins: dict[int | str, Path], default: Path, dev) -> dict:
    rec = {}
    for case in cases():
        inp = make_inputs(case, dev)
        n = max(case.lens)
        base = planned(inp, default, "baseline", n).run(inp.q, inp.k_cache, inp.v_cache,
                                                         inp.block_table, inp.seq_lens)
        base = base.view(torch.int16).clone()
        deep = planned(inp, default, "deep", n)
        res = {"deep": bool(torch.equal(deep.run(inp.q, inp.k_cache, inp.v_cache, inp.block_table,
                                                 inp.seq_lens).view(torch.int16), base))}
        for name, launch_ in tma_variants(inp, cubins, n).items():
            for _ in range(2):  # twice: the merge counters must come back to zero
                out = launch_(inp, torch.full_like(inp.q, float("nan")))
                torch.cuda.synchronize(dev)
                res[name] = res.get(name, True) and bool(torch.equal(out.view(torch.int16), base))
        rec[f"{case.name} lens={case.lens[:4]}"] = res
        log(f"[check] {case.name}: {res}")
    return rec


def bench_large(cubins: dict[int | str, Path], default: Path, dev, repeats: int) -> dict:
    case = cases()[0]
    inp = make_inputs(case, dev)
    out = torch.empty_like(inp.q)
    args = (inp.q, inp.k_cache, inp.v_cache, inp.block_table, inp.seq_lens)
    deep = planned(inp, default, "deep", 16384)
    fns = {"e5m2_deep": lambda: deep.run(*args, out=out)}
    launches = tma_variants(inp, cubins, 16384)
    for name, launch_ in launches.items():
        fns[f"e5m2_{name}"] = (lambda lt: lambda: lt(inp, out))(launch_)
    samples = timing.interleaved(fns, repeats=repeats, device=dev, flush=True)
    kv_bytes = 16 * 16384 * 8 * 128 * 2
    res = {"shape": "B16x16384 GQA32/8 D128 page64 e5m2", "kernel": deep.kernel,
           "persistent_grid": {n: [lt.grid, lt.per_sm] for n, lt in launches.items()
                               if n.startswith("deepp")}, "variants": {}}
    for name, smp in samples["samples_us"].items():
        med = median(smp)
        res["variants"][name] = {"samples_us": smp, "median_us": med, **spread(smp),
                                 "tb_per_s": kv_bytes / med / 1e6}
        log(f"B16x16K {name:18s} {med:7.1f} us  [{min(smp):.1f}..{max(smp):.1f}]  "
            f"{kv_bytes / med / 1e6:.3f} TB/s")
    return res


def bench_small(cubins: dict[int | str, Path], default: Path, dev, repeats: int) -> dict:
    n_inputs = 48
    inputs = [make_inputs(Case(100 + i, 1, "uniform", "1024", 64, "e5m2", 32, 8, 128, [1024]),
                          dev) for i in range(n_inputs)]
    outs = [torch.empty_like(x.q) for x in inputs]
    deep = planned(inputs[0], default, "deep", 1024)
    for x in inputs:
        deep.admit(x.block_table, x.seq_lens)
    state = {"i": 0}

    def rotate(run):
        def fn():
            i = state["i"] = (state["i"] + 1) % n_inputs
            return run(i)
        return fn

    fns = {"e5m2_deep": rotate(lambda i: deep.run(
        inputs[i].q, inputs[i].k_cache, inputs[i].v_cache, inputs[i].block_table,
        inputs[i].seq_lens, outs[i]))}
    # one launcher an input: each input's tensor maps name its own K and V
    per_input = [tma_variants(x, cubins, 1024) for x in inputs]
    for name in per_input[0]:
        launches = [v[name] for v in per_input]
        fns[f"e5m2_{name}"] = rotate(lambda i, ls=launches: ls[i](inputs[i], outs[i]))
    res = {"shape": "B1x1024 GQA32/8 D128 page64 e5m2", "kernel": deep.kernel, "variants": {}}
    names = list(fns)
    graph: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        k = r % len(names)
        for n in names[k:] + names[:k]:
            graph[n].extend(timing.graph_replay_us(fns[n], device=dev, launches=n_inputs,
                                                   replays=3))
    for n in names:
        res["variants"][n] = {"gpu_us_graph_samples": graph[n], "gpu_us_median": median(graph[n]),
                              "gpu_spread": spread(graph[n])}
        log(f"B1x1K   {n:18s} gpu {median(graph[n]):6.2f} us")
    return res


class RawLaunch:
    """One entry point of a cubin with fixed arguments (ctypes values) and geometry."""

    def __init__(self, cubin: Path, entry: str, grid: tuple[int, int, int], block: int,
                 smem: int, values: list):
        from cuda.bindings import driver as d
        self.d, self.entry, self.grid, self.block, self.smem = d, entry, grid, block, smem
        self.raw = op._Launcher._function(d, launch.kernel(str(cubin), entry))
        if smem:
            attr = d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            (err,) = d.cuFuncSetAttribute(self.raw, attr, smem)
            if err != d.CUresult.CUDA_SUCCESS:
                raise RuntimeError(f"{entry}: dynamic shared memory {smem}: {err!r}")
        self.values = values
        self.array = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])

    def __call__(self) -> None:
        stream = torch.cuda.current_stream().cuda_stream
        (err,) = self.d.cuLaunchKernel(self.raw, *self.grid, self.block, 1, 1, self.smem,
                                       stream, ctypes.addressof(self.array), 0)
        if err != self.d.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuLaunchKernel {self.entry}: {err!r}")


def _cache_args(inp) -> list:
    page = inp.k_cache.shape[2]
    return [ctypes.c_void_p(inp.k_cache.data_ptr()), ctypes.c_void_p(inp.v_cache.data_ptr()),
            ctypes.c_void_p(inp.block_table.data_ptr()),
            ctypes.c_int32(inp.block_table.shape[1]), ctypes.c_int32(inp.k_cache.shape[1]),
            ctypes.c_int32(page.bit_length() - 1)]


def read_probe(cubin: Path, inp, chunk: int, order: int, flat: int) -> RawLaunch:
    """paged_read on the split_kv grid of a B x 16K E5M2 plan (or heads fastest)."""
    batch, hkv, splits = inp.q.shape[0], inp.k_cache.shape[1], 16384 // chunk
    sink = torch.zeros(1, dtype=torch.int32, device=inp.q.device)
    values = [*_cache_args(inp), ctypes.c_int32(chunk), ctypes.c_int32(order),
              ctypes.c_int32(flat), ctypes.c_void_p(sink.data_ptr())]
    grid = (hkv, splits, batch) if order else (splits, hkv, batch)
    launch_ = RawLaunch(cubin, "paged_read", grid, 256, 0, values)
    launch_.sink = sink  # type: ignore[attr-defined]  # kept alive with the launch
    return launch_


def bulk_probe(cubin: Path, inp, chunk: int, mode: int, seg: int) -> RawLaunch:
    """paged_bulk_read: split_kv's segments (mode 0), whole pages (1) or flat slices (2)."""
    batch, hkv, splits = inp.q.shape[0], inp.k_cache.shape[1], 16384 // chunk
    values = [*_cache_args(inp), ctypes.c_int32(chunk), ctypes.c_int32(seg), ctypes.c_int32(mode)]
    grid = (splits, 1 if mode == 1 else hkv, batch)
    return RawLaunch(cubin, "paged_bulk_read", grid, 32, 8 * seg, values)


def pattern(cubins: dict[int | str, Path], default: Path, probe: Path, dev, repeats: int) -> dict:
    """B16x16K E5M2 at pages of 16, 64 and 256 tokens: the deep candidate (cp.async and
    tensor copies) beside the read probe of its access pattern (split order as launched,
    heads fastest, and the same bytes a CTA from one contiguous slice)."""
    fns, chunk = {}, 512
    out = None
    for page in (16, 64, 256):
        inp = make_inputs(Case(7, 16, "uniform", "16384", page, "e5m2", 32, 8, 128,
                               [16384] * 16), dev)
        out = torch.empty_like(inp.q)
        deep = planned(inp, default, "deep", 16384)
        assert deep.plan.chunk == chunk, deep.plan
        args = (inp.q, inp.k_cache, inp.v_cache, inp.block_table, inp.seq_lens)
        fns[f"deep_p{page}"] = (lambda d_, a, o: lambda: d_.run(*a, out=o))(deep, args, out)
        fns[f"deept_s3_p{page}"] = (lambda lt, x, o: lambda: lt(x, o))(
            TmaLaunch(planned(inp, cubins[3], "deep", 16384), cubins[3], 3, inp), inp, out)
        fns[f"read_p{page}"] = read_probe(probe, inp, chunk, 0, 0)
        fns[f"read_p{page}_heads"] = read_probe(probe, inp, chunk, 1, 0)
        fns[f"bulk_p{page}"] = bulk_probe(probe, inp, chunk, 0, min(page * ROW, 8192))
        fns[f"bulk_pages_p{page}"] = bulk_probe(probe, inp, max(128, page), 1, 8192)
        fns[f"deepp_p3_p{page}"] = (lambda lt, x, o: lambda: lt(x, o))(
            TmaLaunch(planned(inp, cubins[3], "deep", 16384), cubins[3], 3, inp,
                      persistent=True), inp, out)
        if page == 64:
            for name in ("nokv", "nokv_noepi", "nokv_nopv", "nokv_noqk"):
                fns[f"deep_{name}_p64"] = (lambda d_, a, o: lambda: d_.run(*a, out=o))(
                    planned(inp, cubins[name], "deep", 16384), args, out)
            fns["read_flat"] = read_probe(probe, inp, chunk, 0, 1)
            fns["bulk_flat"] = bulk_probe(probe, inp, chunk, 2, 8192)
            for promo in (0, 128):
                fns[f"deept_s3_p64_l2_{promo}"] = (lambda lt, x, o: lambda: lt(x, o))(
                    TmaLaunch(planned(inp, cubins[3], "deep", 16384), cubins[3], 3, inp, promo),
                    inp, out)
    samples = timing.interleaved(fns, repeats=repeats, device=dev, flush=True)
    kv_bytes = 16 * 16384 * 8 * 128 * 2
    res: dict = {"kv_bytes": kv_bytes, "variants": {}}
    for name, smp in samples["samples_us"].items():
        med = median(smp)
        res["variants"][name] = {"samples_us": smp, "median_us": med, **spread(smp),
                                 "tb_per_s": kv_bytes / med / 1e6}
        log(f"pattern {name:22s} {med:7.1f} us  [{min(smp):.1f}..{max(smp):.1f}]  "
            f"{kv_bytes / med / 1e6:.3f} TB/s")
    return res


def ncu_target(cubins: dict[int | str, Path], default: Path, dev) -> None:
    case = cases()[0]
    inp = make_inputs(case, dev)
    out = torch.empty_like(inp.q)
    planned(inp, default, "deep", 16384).run(inp.q, inp.k_cache, inp.v_cache, inp.block_table,
                                             inp.seq_lens, out=out)
    for s in (3,):
        TmaLaunch(planned(inp, cubins[s], "deep", 16384), cubins[s], s, inp)(inp, out)
        TmaLaunch(planned(inp, cubins[s], "deep", 16384), cubins[s], s, inp,
                  persistent=True)(inp, out)
    torch.cuda.synchronize(dev)


STALLS = ",".join([f"smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio"
                   for r in ("membar", "lg_throttle", "drain", "sleeping", "branch_resolving",
                             "no_instruction", "dispatch_stall", "imc_miss", "misc",
                             "selected", "not_selected")] + ["smsp__inst_executed.sum"])
"""Stall reasons beyond benchmarks/decode_attention.py's, and the instructions."""


def run_ncu(out: Path, build_dir: Path) -> dict:
    ncu = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    cmd = [ncu, "--clock-control", "none", "--kernel-name", "regex:split_kv.*deep",
           "--metrics", NCU_METRICS + "," + STALLS, "--csv", "--page", "raw", sys.executable, __file__,
           "--ncu-target", "--build", str(build_dir)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    start = p.stdout.find('"ID"')
    (out / "ncu.csv").write_text(p.stdout[start:] if start >= 0 else p.stdout + p.stderr)
    return {"returncode": p.returncode, "stderr_tail": p.stderr[-2000:]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/deept"))
    ap.add_argument("--build", type=Path, default=Path("build/tma"))
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--ncu", action="store_true")
    ap.add_argument("--ncu-target", action="store_true")
    ns = ap.parse_args()
    dev = torch.device("cuda", 0)
    major, minor = torch.cuda.get_device_capability(dev)
    arch = f"sm_{major}{minor}"
    if ns.ncu_target:
        ncu_target({s: ns.build / f"split_kv.deept_s{s}.{arch}.cubin" for s in STAGES},
                   ns.build / f"split_kv.deep.{arch}.cubin", dev)
        return 0
    ns.out.mkdir(parents=True, exist_ok=True)
    ns.build.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    nvcc = shutil.which("nvcc") or "nvcc"
    default, cubins = build(nvcc, arch, ns.build)
    probe = ns.build / f"paged_read.{arch}.cubin"
    p = subprocess.run([nvcc, "-cubin", f"-arch={arch}", "-O3", "-std=c++17", "-Werror",
                        "all-warnings", "-o", str(probe), str(PROBE)], capture_output=True,
                       text=True, timeout=120)
    if p.returncode:
        raise SystemExit(f"probe build failed:\n{p.stderr[-2000:]}")
    log(f"built {len(cubins)} depths in {time.time() - t0:.0f} s; default cubin {default}")
    results: dict = {"device": torch.cuda.get_device_name(dev), "arch": arch,
                     "default_cubin": str(default)}
    for name, fn in (("check", lambda: check(cubins, default, dev)),
                     ("bench_large", lambda: bench_large(cubins, default, dev, ns.repeats)),
                     ("bench_small", lambda: bench_small(cubins, default, dev, ns.repeats)),
                     ("pattern", lambda: pattern(cubins, default, probe, dev, ns.repeats)),
                     ("ncu", lambda: run_ncu(ns.out, ns.build) if ns.ncu else {})):
        t = time.time()
        try:
            results[name] = fn()
        except Exception as exc:  # noqa: BLE001 - the device call keeps what it measured
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
            log(f"[{name}] {type(exc).__name__}: {exc}")
        log(f"[{name}] {time.time() - t:.0f} s")
        (ns.out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
