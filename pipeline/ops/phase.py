"""Phase attribution of split_kv by compile-time variants (`RG_PHASE`): each
variant leaves one phase out or does it twice; differences of medians against
the full kernel give each phase's cost. Shared by the phase gate; the benchmark
(benchmarks/decode_attention.py) runs the same variants."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from pipeline.ops.paged_inputs import Case, context_tokens, seq_lengths

VARIANTS = {0: "full", 1: "no_k_load", 2: "no_v_load", 3: "qk_x2", 4: "pv_x2",
            5: "convert_x2", 6: "no_sync", 7: "no_smem_publish"}
# Row phase name -> (variant, sign): cost = sign * (variant - full)
ROW_PHASES = {
    "k_load_e5m2_convert": ("no_k_load", -1), "v_load_e5m2_convert": ("no_v_load", -1),
    "qk": ("qk_x2", +1), "pv": ("pv_x2", +1), "convert": ("convert_x2", +1),
    "sync": ("no_sync", -1), "smem_publish": ("no_smem_publish", -1),
}
ROLES = ("baseline", "pipelined")
_SHAPE = re.compile(r"^B(?P<batch>\d+)-(?P<layout>uniform|ragged)-(?P<context>[0-9.]+K?|page[+-]1|page)"
                    r"-(?P<kv>e5m2|bf16)(?:-h(?P<hq>\d+)x(?P<hkv>\d+))?(?:-d(?P<dim>\d+))?"
                    r"(?:-p(?P<page>\d+))?$")


def parse_shape(shape: str, seed: int = 0) -> Case:
    """`B16-ragged-17.8K-e5m2[-h32x8][-d128][-p64]` -> the case it names (GQA
    32/8, head dim 128 and page 64 unless given; lengths from `seed`).
    Only the E5M2 head-dim-128 group-of-4 kernels are built with every variant."""
    m = _SHAPE.match(shape)
    if not m:
        raise ValueError(f"shape: expected B<batch>-<uniform|ragged>-<context>-<e5m2|bf16>"
                         f"[-h<Hq>x<Hkv>][-d<dim>][-p<page>], got {shape!r}")
    page = int(m["page"] or 64)
    batch, context = int(m["batch"]), m["context"]
    hq, hkv, dim = int(m["hq"] or 32), int(m["hkv"] or 8), int(m["dim"] or 128)
    if (m["kv"], hq // hkv, dim) != ("e5m2", 4, 128):
        raise ValueError(f"shape: phase variants are built for e5m2, 4 query heads per KV head, "
                         f"head dim 128; got {m['kv']}, {hq}/{hkv}, {dim}")
    lens = seq_lengths(m["layout"], context_tokens(context, page), batch, seed)
    return Case(seed, batch, m["layout"], context, page, m["kv"], hq, hkv, dim, lens)


def build_command(compiler: str, arch: str, source: Path, include: Path, out: Path,
                  phase: int) -> list[str]:
    number = re.sub(r"\D", "", arch)
    return [compiler, "-cubin", f"-gencode=arch=compute_{number},code={arch}", "-O3",
            "-std=c++17", "-I", str(include), f"-DRG_PHASE={phase}", "-DRG_ONLY_E5M2_D128_G4",
            "-o", str(out), str(source)]


def build(compiler: str, arch: str, source: Path, include: Path, out_dir: Path) -> dict:
    """One cubin per variant; returns {variant: path} and the logs."""
    cubins, logs = {}, []
    for n, name in VARIANTS.items():
        out = out_dir / f"split_kv.phase{n}.{arch}.cubin"
        cmd = build_command(compiler, arch, source, include, out, n)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
        logs.append({"variant": name, "command": cmd, "returncode": proc.returncode,
                     "log": proc.stdout + proc.stderr})
        if proc.returncode == 0:
            cubins[name] = str(out)
    return {"cubins": cubins, "builds": logs}


def time_variants(case: Case, cubins: dict[str, str], device, repeats: int) -> dict:
    """Every variant of both kernels on `case`, interleaved in rotated order,
    L2 flushed: raw samples and medians per `role:variant`."""
    import functools
    import statistics

    import torch

    from pipeline.ops import decode_attention as op
    from pipeline.ops import timing
    from pipeline.ops.paged_inputs import make_inputs

    inp = make_inputs(case, device)
    out = torch.empty_like(inp.q)
    args = (inp.q, inp.k_cache, inp.v_cache, inp.block_table, inp.seq_lens)
    fns = {}
    for name, path in cubins.items():
        for role in ROLES:
            planned = op.DecodeAttention(*args, max_seq_len=max(case.lens), cubin=Path(path),
                                         k_scale=inp.k_scale, v_scale=inp.v_scale, variant=role)
            fns[f"{role}:{name}"] = functools.partial(planned.run, *args, out=out)
    samples = timing.interleaved(fns, repeats=repeats, device=device, flush=True)
    return {"case": case.as_dict(), "samples_us": samples["samples_us"],
            "order": samples["order"],
            "medians_us": {k: statistics.median(v) for k, v in samples["samples_us"].items()}}


def attribute(medians: dict[str, float], phases: list[str]) -> dict[str, dict[str, float]]:
    """{role: {phase: µs}} from `role:variant` medians; KeyError names a phase
    or variant that is missing."""
    out = {}
    for role in ROLES:
        full = medians[f"{role}:full"]
        costs = {"full": full}
        for phase in phases:
            if phase not in ROW_PHASES:
                raise KeyError(f"phase {phase!r} (known: {', '.join(ROW_PHASES)})")
            variant, sign = ROW_PHASES[phase]
            costs[phase] = sign * (medians[f"{role}:{variant}"] - full)
        out[role] = costs
    return out
