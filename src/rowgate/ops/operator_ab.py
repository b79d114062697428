"""The operator A/B on a device, shared by the operator and phase gates and the lab's
benchmark: a kernel child (`rowgate.ops.sandboxed`) launches an operator's baseline and
candidate on one case, this process compares what they wrote; the child times them
interleaved. Any `paged-decode-attention/1` operator (src/rowgate/ops/contract.py).
Needs torch with CUDA and cuda-core (no pydantic: it runs on bare device images).
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import torch

from rowgate import compressed
from rowgate.ops.cases import Case
from rowgate.ops.contract import ContractError, Operator
from rowgate.ops.paged_inputs import (
    GUARD,
    against_reference,
    bitwise,
    fingerprint,
    guard_writes,
    make_inputs,
    unwritten,
)
from rowgate.ops.reference import decode_attention_fp64
from rowgate.ops.sandboxed import ChildError, Launcher

__all__ = ["CASES", "TIMING", "check_expressible", "run_case", "time_variants",
           "write_records"]

CASES = "cases.json.gz"
"""Sealed gzipped (`rowgate.compressed`): one record per case, ~1 KB each as JSON."""
CASES_CSV = "cases.csv.gz"
TIMING = "timing.json"


def check_expressible(operator: Operator, case_list: list[Case]) -> None:
    """ContractError (one line) for the first case the operator does not declare."""
    for case in case_list:
        if case.hq % case.hkv:
            raise ContractError(f"case {case.name}: {case.hq} query heads are not a multiple "
                                f"of {case.hkv} KV heads")
        why = operator.unsupported(case.kv, case.dim, case.hq // case.hkv, case.page)
        if why:
            raise ContractError(f"case {case.name}: {why}")


def _blob(data: bytes, dtype: torch.dtype, dev: torch.device) -> torch.Tensor:
    if not data:  # a harness has no split counters
        return torch.empty(0, dtype=dtype, device=dev)
    return torch.frombuffer(bytearray(data), dtype=dtype).to(dev)


def run_case(case: Case, spec: Any, cubin: Path, dev: torch.device, order_flip: bool,
             operator: Operator, candidate: str = "", *, child: Launcher,
             harness: dict[str, Any] | None = None) -> dict[str, Any]:
    """Both roles on one case (order alternating between cases), launched by `child`
    (the sandboxed kernel process), judged here: against each other bit for bit and
    against the fp64 reference this process computed from its own copy of the inputs;
    writes outside the output, inputs written and counters left non-zero counted."""
    inp = make_inputs(case, dev)
    ref = decode_attention_fp64(inp.q, inp.k_cache, inp.v_cache, inp.block_table, inp.seq_lens,
                                k_scale=inp.k_scale, v_scale=inp.v_scale)
    entries = operator.entries(case.kv, case.dim, case.hq // case.hkv, candidate)
    order = ["candidate", "baseline"] if order_flip else ["baseline", "candidate"]
    header, blobs = child.request({
        "op": "case", "cubin": child.stage(cubin), "operator": operator.name,
        "table": operator.to_table(), "case": case.as_dict(), "entries": entries,
        "order": order, "harness": harness})
    mine = [fingerprint(inp), inp.k_scale, inp.v_scale]
    if [header["inputs"], header["k_scale"], header["v_scale"]] != mine:
        raise ChildError(f"case {case.name}: the kernel child drew other inputs than rowgate "
                         f"(fingerprint {header['inputs']} against {mine[0]})")
    outs, variants = {}, {}
    for i, role in enumerate(order):
        got = header["roles"][role]
        buf = _blob(blobs[2 * i], torch.int16, dev)
        counters = _blob(blobs[2 * i + 1], torch.int32, dev)
        out = buf[GUARD:-GUARD].view(torch.bfloat16).view(got["shape"])
        rec = against_reference(out, ref, spec.tolerance.rtol, spec.tolerance.atol)
        rec.update(entry=entries[role], launched=got["launched"], threads=got["threads"],
                   grid_x=got["grid_x"], unwritten=unwritten(out), guard_writes=guard_writes(buf),
                   counters_nonzero=int((counters != 0).sum()),
                   inputs_written=bool(got["inputs_written"]), chunk=got["chunk"],
                   splits=got["splits"])
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


def time_case(case: Case, cubins: dict[str, Path], entries: dict[str, str], operator: Operator,
              repeats: int, *, child: Launcher, harness: dict[str, Any] | None = None
              ) -> dict[str, Any]:
    """Every role of every cubin on `case`, timed by `child` (interleaved in rotated
    order, L2 flushed): samples keyed `role:variant`, or `role` for the variant ""."""
    header, _ = child.request({
        "op": "time", "cubins": {v: child.stage(p) for v, p in cubins.items()},
        "entries": entries, "operator": operator.name, "table": operator.to_table(),
        "case": case.as_dict(), "repeats": repeats, "harness": harness})
    return {"case": case.as_dict(), "entries": entries, "samples_us": header["samples_us"],
            "order": header["order"]}


def time_variants(spec: Any, cubin: Path, operator: Operator, candidate: str = "", *,
                  child: Launcher, harness: dict[str, Any] | None = None) -> dict[str, Any]:
    """Baseline and candidate interleaved in alternating order, L2 flushed
    before every timed launch, `timing_repeats` samples each."""
    result = {"repeats": spec.timing_repeats, "order": "alternating", "l2_flush": True,
              "shapes": {}}
    for case in timing_cases(spec, operator):
        entries = operator.entries(case.kv, case.dim, case.hq // case.hkv, candidate)
        result["shapes"][f"B{case.batch}x{case.lens[0]}"] = time_case(
            case, {"": cubin}, entries, operator, spec.timing_repeats, child=child,
            harness=harness)
    return result


def write_records(out: Path, records: list[dict[str, Any]], timing_record: dict[str, Any]) -> None:
    """The gate's raw artifacts: cases.json.gz (full records), cases.csv.gz (one row
    per case and variant) and timing.json."""
    compressed.write_text(out / CASES, json.dumps(records, indent=1) + "\n")
    (out / TIMING).write_text(json.dumps(timing_record, indent=1) + "\n")
    rows = [{"case": r["case"]["name"], "variant": v, "seed": r["case"]["seed"],
             "lens": " ".join(map(str, r["case"]["lens"])),
             **{k: r["variants"][v].get(k) for k in (
                 "entry", "launched", "unwritten", "guard_writes", "counters_nonzero", "inputs_written",
                 "nan", "failures",
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
