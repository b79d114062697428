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
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import torch

from rowgate.ops.cases import Case
from rowgate.ops.contract import Operator
from rowgate.ops.paged_inputs import Inputs, fingerprint, guarded, make_inputs

Reply = tuple[dict[str, Any], list[bytes]]


def case_of(record: dict[str, Any]) -> Case:
    """A case from its `as_dict` record (the name is derived, not an argument)."""
    return Case(**{k: v for k, v in record.items() if k != "name"})


def request_case(req: dict[str, Any]) -> tuple[Operator, Case]:
    """The operator and the case a request names."""
    return Operator.from_table(req["operator"], req["table"]), case_of(req["case"])


def _device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


@dataclass(frozen=True)
class RoleLaunch:
    run: Callable[[torch.Tensor], dict[str, Any]]
    """Launches one role into `out`; returns what the record says of the launch."""
    poison: Callable[[], None] = lambda: None
    """Fills the role's workspace with NaN (correctness runs only: timing launches do
    not pay for it)."""
HarnessFn = Callable[[str, dict[str, Any], torch.Tensor, dict[str, str]], object]
_HARNESSES: dict[str, HarnessFn] = {}


def harness_function(spec: dict[str, Any]) -> HarnessFn:
    """The subject's harness function (`harness/1`), loaded once per file: its root on
    sys.path (a harness imports its own project's modules), the file run as a module."""
    import importlib.util

    key = f"{spec['file']}:{spec['function']}"
    if key not in _HARNESSES:
        if spec["root"] not in sys.path:
            sys.path.insert(0, spec["root"])
        loader = importlib.util.spec_from_file_location("rowgate_subject_harness", spec["file"])
        if loader is None or loader.loader is None:
            raise ImportError(f"cannot load {spec['file']}")
        module = importlib.util.module_from_spec(loader)
        loader.loader.exec_module(module)
        _HARNESSES[key] = getattr(module, spec["function"])
    return _HARNESSES[key]


def _launches(req: dict[str, Any], case: Case, inp: Inputs, role: str) -> RoleLaunch:
    """How one role launches: the fixed contract's planned launch, or the harness
    function given rowgate's inputs and the build's cubins."""
    from rowgate.ops import decode_attention as op

    args = (inp.q, inp.k_cache, inp.v_cache, inp.block_table, inp.seq_lens)
    if req.get("harness"):
        fn = harness_function(req["harness"])
        inputs = {"q": inp.q, "k_cache": inp.k_cache, "v_cache": inp.v_cache,
                  "block_table": inp.block_table, "seq_lens": inp.seq_lens,
                  "k_scale": inp.k_scale, "v_scale": inp.v_scale,
                  "softmax_scale": case.dim ** -0.5, "max_seq_len": max(case.lens),
                  "kv_dtype": case.kv}

        def harness(out: torch.Tensor) -> dict[str, Any]:
            fn(role, inputs, out, req["harness"]["cubins"])
            return {"launched": f"{req['harness']['function']}({role!r})"}
        return RoleLaunch(harness)
    operator, _ = request_case(req)
    planned = op.DecodeAttention(*args, max_seq_len=max(case.lens), cubin=Path(req["cubin"]),
                                 k_scale=inp.k_scale, v_scale=inp.v_scale, operator=operator,
                                 entry=req["entries"][role])

    def fixed(out: torch.Tensor) -> dict[str, Any]:
        planned.run(*args, out=out)
        return {"launched": planned.kernel, "threads": planned.launcher.block,
                "grid_x": planned.launcher.grid[0], "chunk": planned.plan.chunk,
                "splits": planned.plan.splits, "counters": planned.counters}
    return RoleLaunch(fixed, planned.poison_workspace)


def run_roles(req: dict[str, Any]) -> Reply:
    """Each role of one case once, in the requested order, output (and a fixed-contract
    workspace) poisoned before its launch; inputs drawn again after a launch that
    changed them (the next role gets clean ones, the record says which role wrote)."""
    case = case_of(req["case"])
    dev = _device()
    inp = make_inputs(case, dev)
    clean = fingerprint(inp)
    header: dict[str, Any] = {"inputs": clean, "k_scale": inp.k_scale, "v_scale": inp.v_scale,
                              "used_pages": inp.used_pages, "poison_pages": inp.poison_pages,
                              "roles": {}}
    blobs: list[bytes] = []
    for role in req["order"]:
        launch = _launches(req, case, inp, role)
        buf, out = guarded(inp.q)
        launch.poison()
        said = launch.run(out)
        torch.cuda.synchronize(dev)
        changed = fingerprint(inp) != clean
        counters = said.pop("counters", None)
        header["roles"][role] = {"threads": None, "grid_x": None, "chunk": None,
                                 "splits": None, **said, "inputs_written": changed,
                                 "shape": list(out.shape)}
        blobs += [buf.cpu().numpy().tobytes(),
                  counters.cpu().numpy().tobytes() if counters is not None else b""]
        if changed:
            inp = make_inputs(case, dev)
    return header, blobs


def time_roles(req: dict[str, Any]) -> Reply:
    """Every variant (cubin) of every role on one case, interleaved in rotated order,
    L2 flushed: the raw samples, keyed `role:variant` (`role` for the variant "")."""
    from rowgate.ops import timing

    case = case_of(req["case"])
    dev = _device()
    inp = make_inputs(case, dev)
    out = torch.empty_like(inp.q)
    cubins: dict[str, str] = req["cubins"]
    fns: dict[str, Callable[[], object]] = {}
    for variant, path in cubins.items():
        for role in req["entries"]:
            launch = _launches({**req, "cubin": path}, case, inp, role)
            key = f"{role}:{variant}" if variant else role
            fns[key] = functools.partial(launch.run, out)
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
