"""Where the deep candidate's E5M2 B16x16K time goes, in one device call:
the bytes it reads, read by probes that do nothing else (benchmarks/probes/paged_read.cu:
16-byte loads, and bulk copies of split_kv's own segments, of whole pages, of flat slices)
beside the kernel at pages of 16, 64 and 256 tokens; and the kernel's own compute without
its copies (split_kv.cu's RG_DEEP_ABLATE 2, 4-6: all of it, no partial store or merge, no
PV, no QK MMAs), and with them, what each part costs the streaming kernel (7-10: no QK
MMAs, no PV MMAs, no partial store or merge, the partial stored and nothing after it):
timing-only builds, no result comes from them. At page 64 the same for bf16 (256-byte
rows): the deep candidate and its epilogue ablations (9, 10), bulk copies of its segments,
whole pages and flat slices, beside torch SDPA on the same bytes dense, the bf16 bar's
comparison point.

The tensor-copy and persistent forms of the deep candidate first measured with this script
(docs/perf.md) are in commit 6e2d7d6 with their launchers; the copies' L2 hints, early
tickets and successor prefetches in fd7c4e7.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import ctypes
import functools
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
from benchmarks.decode_attention import dense_bf16, log, median, nvcc_cmd, spread

from rowgate.ops import launch, reference, timing
from rowgate.ops.paged_inputs import Case, make_inputs
from rowgate_lab.ops import split_kv as op

REPO = Path(__file__).resolve().parents[1]

PROBE = REPO / "benchmarks" / "probes" / "paged_read.cu"
ROW = 128  # bytes of an E5M2 D128 token row
ABLATIONS = {"nokv": ["RG_DEEP_ABLATE=2"], "nokv_noepi": ["RG_DEEP_ABLATE=4"],
             "nokv_nopv": ["RG_DEEP_ABLATE=5"], "nokv_noqk": ["RG_DEEP_ABLATE=6"],
             "noqk": ["RG_DEEP_ABLATE=7"], "nopv": ["RG_DEEP_ABLATE=8"],
             "noepi": ["RG_DEEP_ABLATE=9"], "storeonly": ["RG_DEEP_ABLATE=10"]}
"""Timing-only builds of the deep unit: no K/V copies (the math on whatever the ring holds),
and without them also no partial store or merge, no PV, no QK MMAs; with the copies, no QK
MMAs, no PV MMAs, no partial store or merge, the partial stored and nothing after it (what
each part costs the streaming kernel)."""
BF16_ABLATIONS = ("noepi", "storeonly")
"""The ablations timed on bf16 too (the epilogue's share there)."""


def build(nvcc: str, arch: str, out: Path) -> tuple[Path, dict[str, Path], Path]:
    """The deep unit as kernels.toml builds it, its ABLATIONS, and the probes."""
    jobs = {"deep": (out / f"split_kv.deep.{arch}.cubin", ["RG_UNIT=3"])}
    for name, defines in ABLATIONS.items():
        jobs[name] = (out / f"split_kv.deep_{name}.{arch}.cubin", ["RG_UNIT=3", *defines])

    def one(job: tuple[Path, list[str]]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(nvcc_cmd(nvcc, arch, *job), capture_output=True, text=True,
                              timeout=300)

    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        done = dict(zip(jobs, pool.map(one, jobs.values())))
    probe = out / f"paged_read.{arch}.cubin"
    p = subprocess.run([nvcc, "-cubin", f"-arch={arch}", "-O3", "-std=c++17", "-Werror",
                        "all-warnings", "-o", str(probe), str(PROBE)], capture_output=True,
                       text=True, timeout=120)
    done["probe"] = p
    (out / "build.log").write_text("\n".join(f"== {n}\n{r.stdout}{r.stderr}"
                                             for n, r in done.items()))
    for name, r in done.items():
        if r.returncode:
            raise SystemExit(f"build {name} failed:\n{r.stderr[-3000:]}")
    return jobs["deep"][0], {n: jobs[n][0] for n in ABLATIONS}, probe


def planned(inp, cubin: Path, variant: str = "deep") -> op.DecodeAttention:
    return op.DecodeAttention(inp.q, inp.k_cache, inp.v_cache, inp.block_table, inp.seq_lens,
                              max_seq_len=16384, cubin=cubin, k_scale=inp.k_scale,
                              v_scale=inp.v_scale, variant=variant, operator=op.SPLIT_KV_DEEP)


class RawLaunch:
    """One entry point of a cubin with fixed arguments (ctypes values) and geometry;
    `keep`: the tensors the arguments point into, alive as long as the launch."""

    def __init__(self, cubin: Path, entry: str, grid: tuple[int, int, int], block: int,
                 smem: int, values: list, keep: tuple = ()):
        from cuda.bindings import driver as d
        self.d, self.entry, self.grid, self.block, self.smem = d, entry, grid, block, smem
        self.raw = op._Launcher._function(d, launch.kernel(str(cubin), entry))
        if smem:
            attr = d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            (err,) = d.cuFuncSetAttribute(self.raw, attr, smem)
            if err != d.CUresult.CUDA_SUCCESS:
                raise RuntimeError(f"{entry}: dynamic shared memory {smem}: {err!r}")
        self.values, self.keep = values, keep
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
    return RawLaunch(cubin, "paged_read", grid, 256, 0, values, keep=(sink,))


def bulk_probe(cubin: Path, inp, chunk: int, mode: int, seg: int) -> RawLaunch:
    """paged_bulk_read: split_kv's segments (mode 0), whole pages (1) or flat slices (2)."""
    batch, hkv, splits = inp.q.shape[0], inp.k_cache.shape[1], 16384 // chunk
    row = inp.k_cache.shape[-1] * inp.k_cache.element_size()  # bytes a token row
    values = [*_cache_args(inp), ctypes.c_int32(chunk), ctypes.c_int32(seg), ctypes.c_int32(mode),
              ctypes.c_int32(row)]
    grid = (splits, 1 if mode == 1 else hkv, batch)
    return RawLaunch(cubin, "paged_bulk_read", grid, 32, 8 * seg, values)


def pattern(default: Path, ablations: dict[str, Path], probe: Path, dev, repeats: int) -> dict:
    """B16x16K E5M2 at pages of 16, 64 and 256 tokens: the deep candidate beside the probes
    of its access pattern on its own grid (split order as launched, heads fastest, the same
    bytes a CTA from one contiguous slice; bulk copies of its segments and of whole pages);
    at page 64 its compute without copies. Every deep launch is checked bit for bit against
    the `_base` of its plan first."""
    fns: dict = {}
    bits = {}
    for page in (16, 64, 256):
        inp = make_inputs(Case(7, 16, "uniform", "16384", page, "e5m2", 32, 8, 128,
                               [16384] * 16), dev)
        out = torch.empty_like(inp.q)
        args = (inp.q, inp.k_cache, inp.v_cache, inp.block_table, inp.seq_lens)
        deep = planned(inp, default)
        chunk = deep.plan.chunk
        base = planned(inp, default, "baseline").run(*args).view(torch.int16).clone()
        bits[f"deep_p{page}"] = bool(torch.equal(deep.run(*args).view(torch.int16), base))
        fns[f"deep_p{page}"] = functools.partial(deep.run, *args, out=out)
        fns[f"read_p{page}"] = read_probe(probe, inp, chunk, 0, 0)
        fns[f"read_p{page}_heads"] = read_probe(probe, inp, chunk, 1, 0)
        fns[f"bulk_p{page}"] = bulk_probe(probe, inp, chunk, 0, min(page * ROW, 8192))
        fns[f"bulk_pages_p{page}"] = bulk_probe(probe, inp, max(128, page), 1, 8192)
        if page == 64:
            for name, cub in ablations.items():
                fns[f"deep_{name}_p64"] = functools.partial(
                    planned(inp, cub).run, *args, out=out)
            fns["read_flat"] = read_probe(probe, inp, chunk, 0, 1)
            fns["bulk_flat"] = bulk_probe(probe, inp, chunk, 2, 8192)
    bits.update(bf16_pattern(default, {n: ablations[n] for n in BF16_ABLATIONS}, probe, dev, fns))
    log(f"pattern bitwise == baseline: {bits}")
    samples = timing.interleaved(fns, repeats=repeats, device=dev, flush=True)
    kv_bytes = 16 * 16384 * 8 * 128 * 2
    res: dict = {"kv_bytes": kv_bytes, "chunk": chunk, "bitwise_equal_to_baseline": bits,
                 "order": samples["order"], "variants": {}}
    for name, smp in samples["samples_us"].items():
        med = median(smp)
        nbytes = kv_bytes * (2 if name.startswith("bf16_") else 1)
        res["variants"][name] = {"samples_us": smp, "median_us": med, **spread(smp),
                                 "kv_bytes": nbytes, "tb_per_s": nbytes / med / 1e6}
        log(f"pattern {name:22s} {med:7.1f} us  [{min(smp):.1f}..{max(smp):.1f}]  "
            f"{nbytes / med / 1e6:.3f} TB/s")
    return res


def bf16_pattern(default: Path, ablations: dict[str, Path], probe: Path, dev,
                 fns: dict) -> dict[str, bool]:
    """B16x16K bf16 at page 64 into `fns`: the deep candidate and `ablations` of it, bulk
    copies of its segments, of whole pages and of flat slices (the access pattern's DMA
    ceiling for 256-byte rows), and torch SDPA on the same bytes dense (the bf16 bar's
    comparison point); the deep launch checked bit for bit against its plan's `_base`
    first."""
    inp = make_inputs(Case(7, 16, "uniform", "16384", 64, "bf16", 32, 8, 128, [16384] * 16),
                      dev)
    out = torch.empty_like(inp.q)
    args = (inp.q, inp.k_cache, inp.v_cache, inp.block_table, inp.seq_lens)
    deep = planned(inp, default)
    base = planned(inp, default, "baseline").run(*args).view(torch.int16).clone()
    bits = {"bf16_deep_p64": bool(torch.equal(deep.run(*args).view(torch.int16), base))}
    fns["bf16_deep_p64"] = functools.partial(deep.run, *args, out=out)
    for name, cub in ablations.items():
        fns[f"bf16_deep_{name}_p64"] = functools.partial(planned(inp, cub).run, *args,
                                                            out=out)
    fns["bf16_bulk_p64"] = bulk_probe(probe, inp, deep.plan.chunk, 0, 8192)
    fns["bf16_bulk_pages_p64"] = bulk_probe(probe, inp, 128, 1, 8192)
    fns["bf16_bulk_flat"] = bulk_probe(probe, inp, deep.plan.chunk, 2, 8192)
    dense = dense_bf16(16, 8, 16384, 128, dev, torch.Generator(device=dev).manual_seed(11))
    fns["bf16_sdpa_dense"] = lambda: reference.dense_sdpa(inp.q, *dense)
    return bits


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/deep-ceiling"))
    ap.add_argument("--build", type=Path, default=Path("/tmp/deep-ceiling-build"))
    ap.add_argument("--repeats", type=int, default=15)
    ns = ap.parse_args()
    dev = torch.device("cuda", 0)
    major, minor = torch.cuda.get_device_capability(dev)
    arch = f"sm_{major}{minor}"
    ns.out.mkdir(parents=True, exist_ok=True)
    ns.build.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    default, ablations, probe = build(shutil.which("nvcc") or "nvcc", arch, ns.build)
    log(f"built in {time.time() - t0:.0f} s")
    results = {"device": torch.cuda.get_device_name(dev), "arch": arch,
               "pattern": pattern(default, ablations, probe, dev, ns.repeats)}
    (ns.out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    shutil.copy(ns.build / "build.log", ns.out / "build.log")
    return 0


if __name__ == "__main__":
    sys.exit(main())
