"""The operator A/B on a device, shared by the operator gate and the benchmark:
launch an operator's baseline and candidate on one case and compare; time both
interleaved. Any `paged-decode-attention/1` operator (src/rowgate/ops/contract.py).
Needs torch with CUDA and cuda-core (no pydantic: it runs on bare device images).
"""

from __future__ import annotations

import csv
import functools
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rowgate import compressed
from rowgate.ops import decode_attention as op
from rowgate.ops import timing
from rowgate.ops.contract import ContractError, Operator
from rowgate.ops.paged_inputs import (
    UNWRITTEN_BF16,
    Case,
    against_reference,
    bitwise,
    cases,
    make_inputs,
    unwritten,
)
from rowgate.ops.reference import decode_attention_fp64

__all__ = ["CASES", "TIMING", "cases", "check_expressible", "run_case", "time_variants",
           "write_records"]

CASES = "cases.json.gz"
"""Sealed gzipped (`rowgate.compressed`): one record per case, ~1 KB each as JSON."""
CASES_CSV = "cases.csv.gz"
TIMING = "timing.json"
GUARD = 256
"""Sentinel elements before and after the output: a write there is out of bounds."""


def check_expressible(operator: Operator, case_list: list[Case]) -> None:
    """ContractError (one line) for the first case the operator does not declare."""
    for case in case_list:
        if case.hq % case.hkv:
            raise ContractError(f"case {case.name}: {case.hq} query heads are not a multiple "
                                f"of {case.hkv} KV heads")
        why = operator.unsupported(case.kv, case.dim, case.hq // case.hkv, case.page)
        if why:
            raise ContractError(f"case {case.name}: {why}")


def _guarded(like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(buffer, out): out is the middle of a sentinel-filled buffer with GUARD
    elements on each side."""
    n = like.numel()
    buf = torch.full((n + 2 * GUARD,), UNWRITTEN_BF16, dtype=torch.int16, device=like.device)
    out = buf[GUARD:GUARD + n].view(torch.bfloat16).view(like.shape)
    return buf, out


def _guard_writes(buf: torch.Tensor) -> int:
    edges = torch.cat([buf[:GUARD], buf[-GUARD:]])
    return int((edges != UNWRITTEN_BF16).sum())


def run_case(case: Case, spec: Any, cubin: Path, dev: torch.device, order_flip: bool,
             operator: Operator, candidate: str = "") -> dict[str, Any]:
    """Both roles on one case (order alternating between cases), against each other
    bit for bit and against the fp64 reference; outputs and workspace poisoned
    before each launch, writes outside the output and counters left non-zero counted."""
    inp = make_inputs(case, dev)
    ref = decode_attention_fp64(inp.q, inp.k_cache, inp.v_cache, inp.block_table, inp.seq_lens,
                                k_scale=inp.k_scale, v_scale=inp.v_scale)
    group = case.hq // case.hkv
    entries = operator.entries(case.kv, case.dim, group, candidate)
    order = ["candidate", "baseline"] if order_flip else ["baseline", "candidate"]
    args = (inp.q, inp.k_cache, inp.v_cache, inp.block_table, inp.seq_lens)
    outs, variants = {}, {}
    for role in order:
        planned = op.DecodeAttention(*args, max_seq_len=max(case.lens), cubin=cubin,
                                     k_scale=inp.k_scale, v_scale=inp.v_scale,
                                     operator=operator, entry=entries[role])
        planned.poison_workspace()
        buf, out = _guarded(inp.q)
        planned.run(*args, out=out)
        torch.cuda.synchronize(dev)
        rec = against_reference(out, ref, spec.tolerance.rtol, spec.tolerance.atol)
        rec.update(entry=entries[role], launched=planned.kernel, threads=planned.launcher.block,
                   grid_x=planned.launcher.grid[0], unwritten=unwritten(out),
                   guard_writes=_guard_writes(buf),
                   counters_nonzero=int((planned.counters != 0).sum()),
                   chunk=planned.plan.chunk, splits=planned.plan.splits)
        variants[role] = rec
        outs[role] = out
    return {"case": case.as_dict(), "order": order, "k_scale": inp.k_scale,
            "v_scale": inp.v_scale, "used_pages": inp.used_pages,
            "poison_pages": inp.poison_pages, "variants": variants,
            "bitwise": bitwise(outs["baseline"], outs["candidate"])}


def timing_cases(spec: Any, operator: Operator) -> list[Case]:
    """The largest uniform batch at 16384 tokens and one sequence at 1024, on the
    spec's first heads, largest head dim and page (64 when the spec has it) that
    the operator declares."""
    kv = next((k for k in spec.kv_dtypes if k in operator.kv_dtypes), None)
    heads = next(((hq, hkv) for hq, hkv in spec.heads
                  if hq % hkv == 0 and kv and hq // hkv in operator.groups_for(kv)), None)
    dims = [d for d in spec.head_dims if d in operator.head_dims]
    pages = [p for p in spec.page_sizes if p in operator.page_sizes]
    if kv is None or heads is None or not dims or not pages:
        return []
    page = 64 if 64 in pages else pages[0]
    hq, hkv = heads
    return [Case(0, batch, "uniform", str(ctx), page, kv, hq, hkv, max(dims), [ctx] * batch)
            for batch, ctx in ((max(spec.batches), 16384), (1, 1024))]


def _time_case(case: Case, spec: Any, cubin: Path, dev: torch.device, operator: Operator,
               candidate: str) -> dict[str, Any]:
    inp = make_inputs(case, dev)
    out = torch.empty_like(inp.q)
    args = (inp.q, inp.k_cache, inp.v_cache, inp.block_table, inp.seq_lens)
    entries = operator.entries(case.kv, case.dim, case.hq // case.hkv, candidate)
    fns: dict[str, Callable[[], object]] = {}
    for role, entry in entries.items():
        planned = op.DecodeAttention(*args, max_seq_len=max(case.lens), cubin=cubin,
                                     k_scale=inp.k_scale, v_scale=inp.v_scale,
                                     operator=operator, entry=entry)
        fns[role] = functools.partial(planned.run, *args, out=out)
    samples = timing.interleaved(fns, repeats=spec.timing_repeats, device=dev)
    return {"case": case.as_dict(), "entries": entries, "samples_us": samples["samples_us"],
            "order": samples["order"]}


def time_variants(spec: Any, cubin: Path, dev: torch.device, operator: Operator,
                  candidate: str = "") -> dict[str, Any]:
    """Baseline and candidate interleaved in alternating order, L2 flushed
    before every timed launch, `timing_repeats` samples each."""
    result = {"repeats": spec.timing_repeats, "order": "alternating", "l2_flush": True,
              "shapes": {}}
    for case in timing_cases(spec, operator):
        result["shapes"][f"B{case.batch}x{case.lens[0]}"] = _time_case(
            case, spec, cubin, dev, operator, candidate)
        torch.cuda.empty_cache()
    return result


def write_records(out: Path, records: list[dict[str, Any]], timing_record: dict[str, Any]) -> None:
    """The gate's raw artifacts: cases.json.gz (full records), cases.csv.gz (one row
    per case and variant) and timing.json."""
    compressed.write_text(out / CASES, json.dumps(records, indent=1) + "\n")
    (out / TIMING).write_text(json.dumps(timing_record, indent=1) + "\n")
    rows = [{"case": r["case"]["name"], "variant": v, "seed": r["case"]["seed"],
             "lens": " ".join(map(str, r["case"]["lens"])),
             **{k: r["variants"][v].get(k) for k in (
                 "entry", "launched", "unwritten", "guard_writes", "counters_nonzero", "nan", "failures",
                 "max_abs_err", "max_rel_err", "first_index")},
             "bitwise_mismatches": r["bitwise"]["mismatches"],
             "bitwise_first_index": r["bitwise"]["first_index"]}
            for r in records for v in r["variants"]]
    table = io.StringIO(newline="")
    if rows:
        writer = csv.DictWriter(table, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    compressed.write_text(out / CASES_CSV, table.getvalue())
