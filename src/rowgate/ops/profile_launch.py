"""`python -m rowgate.ops.profile_launch REQUEST.json`: launch one entry point of an
operator on one case, for a profiler that watches this process (ncu).

The request names the cubin, the operator table (as in kernels.toml), the entry point,
the case and how many launches: `warmup` unprofiled ones, then `launches` more. The
profiler selects the launches by kernel name and a launch skip equal to `warmup`.
Prints one JSON line: the entry, the plan (chunk, splits, shared memory) and the
grid. Needs torch with CUDA and cuda-core only.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from rowgate.ops.cases import Case
from rowgate.ops.contract import Operator


def parse_request(req: dict[str, Any]) -> tuple[Operator, Case]:
    """The operator and the case a request names (as the phase gate writes it)."""
    operator = Operator.from_table(req["operator"], req["table"])
    case = Case(**{k: v for k, v in req["case"].items() if k != "name"})  # name: derived
    return operator, case


def main(argv: list[str]) -> int:
    import torch

    from rowgate.ops import decode_attention as op
    from rowgate.ops.paged_inputs import make_inputs

    req = json.loads(Path(argv[0]).read_text())
    operator, case = parse_request(req)
    dev = torch.device("cuda:0")
    inp = make_inputs(case, dev)
    args = (inp.q, inp.k_cache, inp.v_cache, inp.block_table, inp.seq_lens)
    planned = op.DecodeAttention(*args, max_seq_len=max(case.lens), cubin=Path(req["cubin"]),
                                 k_scale=inp.k_scale, v_scale=inp.v_scale, operator=operator,
                                 entry=req["entry"])
    out = torch.empty_like(inp.q)
    for _ in range(req["warmup"] + req["launches"]):
        planned.run(*args, out=out)
    torch.cuda.synchronize(dev)
    print(json.dumps({"entry": planned.entry, "chunk": planned.plan.chunk,
                      "splits": planned.plan.splits, "smem": planned.launcher.smem,
                      "grid": list(planned.launcher.grid), "block": planned.launcher.block,
                      "case": case.name}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
