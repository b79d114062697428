"""`python -m rowgate.ops.launch_child`: the process in which a subject's kernels run.

A subject's cubin launched in rowgate's own CUDA context could write anywhere in that
context: into the fp64 reference, the comparison, the timing buffers. So its kernels run
here, in a child process the sandbox confines (`rowgate.ops.sandboxed` starts it with
the GPU nodes and nothing else writable), and rowgate's process keeps the inputs it made,
the reference and every comparison in a context no subject kernel shares.

The child gets each case as its description (seed, shapes, lengths) and makes the
inputs with rowgate's own generator (`make_inputs`), bit for bit the parent's: shipping
gigabytes of KV cache per case through a pipe would cost more than drawing them again,
and the fingerprint it returns proves the two agree. It returns raw bytes only: each
role's whole guarded output buffer and its split counters, which the parent judges.

Protocol: one JSON request per line on stdin; per request one JSON header line and then
the payload blobs the header counts, on the descriptor stdout had at start. stdout
itself is pointed at stderr first, so a kernel's printf or a library's print lands in the
log and never in the protocol. Needs torch with CUDA and cuda-core only.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import torch

from rowgate.ops.contract import Operator
from rowgate.ops.paged_inputs import Case, fingerprint, guarded, make_inputs

Reply = tuple[dict[str, Any], list[bytes]]


def case_of(record: dict[str, Any]) -> Case:
    """A case from its `as_dict` record (the name is derived, not an argument)."""
    return Case(**{k: v for k, v in record.items() if k != "name"})


def request_case(req: dict[str, Any]) -> tuple[Operator, Case]:
    """The operator and the case a request names."""
    return Operator.from_table(req["operator"], req["table"]), case_of(req["case"])


def _device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


def run_roles(req: dict[str, Any]) -> Reply:
    """Each role of one case once, in the requested order, output and workspace poisoned
    before its launch; inputs drawn again after a launch that changed them (the next role
    gets clean ones, the record says which role wrote)."""
    from rowgate.ops import decode_attention as op

    operator, case = request_case(req)
    dev = _device()
    inp = make_inputs(case, dev)
    clean = fingerprint(inp)
    header: dict[str, Any] = {"inputs": clean, "k_scale": inp.k_scale, "v_scale": inp.v_scale,
                              "used_pages": inp.used_pages, "poison_pages": inp.poison_pages,
                              "roles": {}}
    blobs: list[bytes] = []
    for role in req["order"]:
        args = (inp.q, inp.k_cache, inp.v_cache, inp.block_table, inp.seq_lens)
        planned = op.DecodeAttention(*args, max_seq_len=max(case.lens), cubin=Path(req["cubin"]),
                                     k_scale=inp.k_scale, v_scale=inp.v_scale, operator=operator,
                                     entry=req["entries"][role])
        planned.poison_workspace()
        buf, out = guarded(inp.q)
        planned.run(*args, out=out)
        torch.cuda.synchronize(dev)
        changed = fingerprint(inp) != clean
        header["roles"][role] = {
            "launched": planned.kernel, "threads": planned.launcher.block,
            "grid_x": planned.launcher.grid[0], "chunk": planned.plan.chunk,
            "splits": planned.plan.splits, "inputs_written": changed,
            "shape": list(out.shape)}
        blobs += [buf.cpu().numpy().tobytes(), planned.counters.cpu().numpy().tobytes()]
        if changed:
            inp = make_inputs(case, dev)
    return header, blobs


def time_roles(req: dict[str, Any]) -> Reply:
    """Every variant (cubin) of every role on one case, interleaved in rotated order,
    L2 flushed: the raw samples, keyed `role:variant` (`role` for the variant "")."""
    from rowgate.ops import decode_attention as op
    from rowgate.ops import timing

    operator, case = request_case(req)
    dev = _device()
    inp = make_inputs(case, dev)
    out = torch.empty_like(inp.q)
    args = (inp.q, inp.k_cache, inp.v_cache, inp.block_table, inp.seq_lens)
    cubins: dict[str, str] = req["cubins"]
    fns: dict[str, Callable[[], object]] = {}
    for variant, path in cubins.items():
        for role, entry in req["entries"].items():
            planned = op.DecodeAttention(*args, max_seq_len=max(case.lens), cubin=Path(path),
                                         k_scale=inp.k_scale, v_scale=inp.v_scale,
                                         operator=operator, entry=entry)
            key = f"{role}:{variant}" if variant else role
            fns[key] = functools.partial(planned.run, *args, out=out)
    samples = timing.interleaved(fns, repeats=req["repeats"], device=dev,
                                 flush=req.get("flush", True))
    del fns, inp, out
    torch.cuda.empty_cache()
    return {"samples_us": samples["samples_us"], "order": samples["order"]}, []


def describe(req: dict[str, Any]) -> Reply:
    """What this child is and sees: its torch and device, which of the request's `paths`
    exist for it, and the fingerprint of a case's inputs drawn on the CPU (the agreement
    check, testable without a GPU)."""
    header: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.cuda.is_available(),
                              "pid": os.getpid(),
                              "visible": {p: os.path.exists(p) for p in req.get("paths", [])}}
    if "case" in req:
        header["inputs"] = fingerprint(make_inputs(case_of(req["case"]), "cpu"))
    return header, []


HANDLERS: dict[str, Callable[[dict[str, Any]], Reply]] = {
    "case": run_roles, "time": time_roles, "describe": describe}


def _reply(proto: IO[bytes], header: dict[str, Any], blobs: list[bytes]) -> None:
    header["payload"] = [len(b) for b in blobs]
    proto.write(json.dumps(header).encode() + b"\n")
    for blob in blobs:
        proto.write(blob)
    proto.flush()


def main() -> int:
    proto = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # printf from a kernel, print from a library: the log, not the protocol
    sys.stdout = sys.stderr
    for line in sys.stdin:
        req = json.loads(line)
        try:
            header, blobs = HANDLERS[req["op"]](req)
        except Exception as exc:  # noqa: BLE001 - the parent names it in the gate's reason
            header, blobs = {"error": f"{type(exc).__name__}: {exc}".strip()[:2000]}, []
        _reply(proto, header, blobs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
