"""The operator A/B on a device, shared by the operator gate and the benchmark:
launch both variants on one case and compare; time both variants interleaved.
Needs torch with CUDA and cuda-core (no pydantic: it runs on bare device images).
"""

from __future__ import annotations

import csv
import functools
import json
from pathlib import Path

import torch

from pipeline.ops import decode_attention as op
from pipeline.ops import timing
from pipeline.ops.paged_inputs import (
    Case,
    against_reference,
    bitwise,
    cases,
    make_inputs,
    poisoned_output,
    unwritten,
)
from pipeline.ops.reference import decode_attention_fp64

__all__ = ["CASES", "TIMING", "cases", "run_case", "time_variants", "write_records"]

CASES = "cases.json"
TIMING = "timing.json"


def _launch(inp, case: Case, variant: str, cubin: Path, out: torch.Tensor) -> torch.Tensor:
    return op.decode_attention(inp.q, inp.k_cache, inp.v_cache, inp.block_table, inp.seq_lens,
                               max_seq_len=max(case.lens), cubin=cubin, k_scale=inp.k_scale,
                               v_scale=inp.v_scale, variant=variant, out=out)


def run_case(case: Case, spec, cubin: Path, dev: torch.device, order_flip: bool) -> dict:
    """Both variants on one case (order alternating between cases), against
    each other bit for bit and against the fp64 reference."""
    inp = make_inputs(case, dev)
    ref = decode_attention_fp64(inp.q, inp.k_cache, inp.v_cache, inp.block_table, inp.seq_lens,
                                k_scale=inp.k_scale, v_scale=inp.v_scale)
    names = {"baseline": spec.baseline, "candidate": spec.candidate}
    order = ["candidate", "baseline"] if order_flip else ["baseline", "candidate"]
    outs, variants = {}, {}
    for role in order:
        out = poisoned_output(inp.q)
        _launch(inp, case, names[role], cubin, out)
        torch.cuda.synchronize(dev)
        rec = against_reference(out, ref, spec.tolerance.rtol, spec.tolerance.atol)
        rec["unwritten"] = unwritten(out)
        variants[role] = rec
        outs[role] = out
    return {"case": case.as_dict(), "order": order, "k_scale": inp.k_scale,
            "v_scale": inp.v_scale, "used_pages": inp.used_pages,
            "poison_pages": inp.poison_pages, "variants": variants,
            "bitwise": bitwise(outs["baseline"], outs["candidate"])}


def timing_cases(spec) -> list[Case]:
    """The target shapes (GQA 32/8, head dim 128, page 64) the spec covers:
    largest uniform batch at 16384 and one sequence at 1024."""
    out = []
    kv = spec.kv_dtypes[0]
    for batch, ctx in ((max(spec.batches), 16384), (1, 1024)):
        out.append(Case(0, batch, "uniform", str(ctx), 64, kv, 32, 8, 128, [ctx] * batch))
    return out


def _time_case(case: Case, spec, names: dict[str, str], cubin: Path,
               dev: torch.device) -> dict:
    inp = make_inputs(case, dev)
    out = torch.empty_like(inp.q)
    args = (inp.q, inp.k_cache, inp.v_cache, inp.block_table, inp.seq_lens)
    fns = {}
    for role, name in names.items():
        planned = op.DecodeAttention(*args, max_seq_len=max(case.lens), cubin=cubin,
                                     k_scale=inp.k_scale, v_scale=inp.v_scale, variant=name)
        fns[role] = functools.partial(planned.run, *args, out=out)
    samples = timing.interleaved(fns, repeats=spec.timing_repeats, device=dev)
    return {"case": case.as_dict(), "samples_us": samples["samples_us"],
            "order": samples["order"]}


def time_variants(spec, cubin: Path, dev: torch.device) -> dict:
    """Baseline and candidate interleaved in alternating order, L2 flushed
    before every timed launch, `timing_repeats` samples each."""
    result = {"repeats": spec.timing_repeats, "order": "alternating", "l2_flush": True,
              "shapes": {}}
    names = {"baseline": spec.baseline, "candidate": spec.candidate}
    for case in timing_cases(spec):
        result["shapes"][f"B{case.batch}x{case.lens[0]}"] = _time_case(case, spec, names,
                                                                       cubin, dev)
        torch.cuda.empty_cache()
    return result


def write_records(out: Path, records: list[dict], timing_record: dict) -> None:
    """The gate's raw artifacts: cases.json (full records), cases.csv (one row
    per case and variant) and timing.json."""
    (out / CASES).write_text(json.dumps(records, indent=1) + "\n")
    (out / TIMING).write_text(json.dumps(timing_record, indent=1) + "\n")
    rows = [{"case": r["case"]["name"], "variant": v, "seed": r["case"]["seed"],
             "lens": " ".join(map(str, r["case"]["lens"])),
             **{k: r["variants"][v][k] for k in ("unwritten", "nan", "failures", "max_abs_err",
                                                  "max_rel_err", "first_index")},
             "bitwise_mismatches": r["bitwise"]["mismatches"],
             "bitwise_first_index": r["bitwise"]["first_index"]}
            for r in records for v in r["variants"]]
    with (out / "cases.csv").open("w", newline="") as fh:
        if rows:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
