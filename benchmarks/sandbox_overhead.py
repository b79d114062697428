"""The sandbox's cost on GPU work: a CUDA workload timed inside bubblewrap (rowgate's
subject-step profile with the GPU nodes bound) and outside it, in alternating rounds.

    python3 benchmarks/sandbox_overhead.py --out DIR [--rounds 20] [--size 8192]
    PYTHONPATH=. python3 benchmarks/sandbox_overhead.py --workload operator --out DIR \
        [--rounds 16] [--nvcc PATH]
    PYTHONPATH=. python3 benchmarks/sandbox_overhead.py --workload throughput --out DIR \
        [--rounds 16] [--device cuda] [--listen socket|port]

`matmul`: each round starts a fresh process (as a sandboxed step does) that times
`--iters` bf16 matmuls with CUDA events after a warm-up.
`operator`: the operator gate's own timing path. An external subject (pagedmini) is
gated twice with the operator-only row, once as is and once with `[sandbox] mode =
"off"` (both bundles sealed under DIR/evidence, their timing metrics compared); then
each round starts a kernel child (`rowgate.ops.sandboxed.KernelChild`) confined and
one unconfined, in alternating order, and times the built cubin's baseline and
candidate on the gate's B16 x 16384 shape as the gate does (9 interleaved samples,
L2 flushed); the round's figure is the ratio of medians.
`throughput`: a throughput A/A through a served engine. The OpenAI fixture server
(tests/fixtures/openai_server.py, its own torch model code, not rowgate's) on the tiny
model is started twice on the same device as a subject's server is: once confined (the
arm's command in bubblewrap, only loopback) and once unconfined. `--listen socket` (the
default): both listen on their own Unix socket (`--uds {socket}`), so the sandbox is the
only difference; `--listen port`: the confined one behind the relay into its namespace,
the unconfined one on the host's loopback. Each round sends both the same pass
(`--concurrency` streams of `--output-len` tokens) `--passes` times, interleaved (A B,
B A, …: the fixture server is host-bound, and a host-state switch that lasts a pass or
more then lands on both sides), and the round's figure is output tokens per second
inside / outside.
The figure is the paired ratio inside / outside per round, its median and a 95 %
bootstrap interval (scipy). Writes DIR/sandbox-overhead[-operator|-throughput].json; docs/perf.md
cites it with the device, the commit and the bundles.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from rowgate import sandbox

WORKLOAD = """
import sys, torch
n, iters = int(sys.argv[1]), int(sys.argv[2])
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
for _ in range(5):
    a @ b
torch.cuda.synchronize()
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
for _ in range(iters):
    a @ b
end.record()
torch.cuda.synchronize()
print(start.elapsed_time(end) / iters)
"""


def _time(script: Path, confined: bool, size: int, iters: int) -> float:
    step = sandbox.Step([sys.executable, str(script), str(size), str(iters)], cwd=script.parent,
                        gpu=True, limits=sandbox.Limits(wall_s=300, memory_bytes=None))
    done = sandbox.run(step, confined=confined)
    if done.returncode != 0:
        raise SystemExit(f"workload ({'inside' if confined else 'outside'}) exited "
                         f"{done.returncode}: {done.stderr.decode(errors='replace')[-500:]}")
    return float(done.stdout.decode().strip().splitlines()[-1])


MATRIX = {"batches": "[16]", "layouts": '["uniform"]', "contexts": '["1024", "16384"]',
          "page_sizes": "[64]", "kv_dtypes": '["e5m2"]', "heads": "[[32, 8]]",
          "head_dims": "[128]", "timing_repeats": "25"}
"""The operator gate's matrix in the benchmark's rows (the row's own runs 576 cases)."""


def _summary(ratios: list[float]) -> dict[str, Any]:
    arr = np.array(ratios)
    ci = stats.bootstrap((arr,), np.median, confidence_level=0.95, random_state=0,
                         method="percentile").confidence_interval
    return {"ratio_median": float(np.median(arr)), "ratio_ci95": [ci.low, ci.high]}


def _pagedmini(out: Path, nvcc: str | None) -> tuple[dict[str, Any], Path, Path]:
    """Gate pagedmini's operator with the sandbox on and off; (the runs, the built
    cubin, the subject's kernels.toml)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from subject_gates import PAGEDMINI_ROW, gate, operator_only

    from tests.subjects import paged_decode_subject

    subject = Path(paged_decode_subject(out / "subjects" / "pagedmini").working_dir)
    on = operator_only(PAGEDMINI_ROW, out)
    text = on.read_text()
    for key, value in MATRIX.items():  # the timed shape and two cases: the gate's path, fast
        text = re.sub(rf"^{key} = .*$", f"{key} = {value}", text, count=1, flags=re.M)
    on.write_text(text)
    off = on.with_name(on.name.replace(".toml", "-UNCONFINED.toml"))
    off.write_text(on.read_text().replace(f'id = "{on.stem}"', f'id = "{off.stem}"', 1)
                   + '\n[sandbox]\nmode = "off"\nreason = "the sandbox overhead benchmark\'s '
                   'unconfined twin"\n')
    runs = {name: gate(name, row, subject, out, nvcc) for name, row in
            (("sandbox-on", on), ("sandbox-off", off))}
    bundle = runs["sandbox-on"]["bundle"]
    if bundle is None:
        raise SystemExit(f"the sandboxed gate sealed no bundle: see {out}/gate-log-sandbox-on.txt")
    cubin = next(Path(bundle).glob("artifacts/build/**/sm_90/**/*.cubin"), None) or next(
        Path(bundle).glob("artifacts/build/**/*.cubin"))
    return runs, cubin, subject / "kernels" / "kernels.toml"


def _operator(ns: argparse.Namespace) -> dict[str, Any]:
    import tomllib

    from rowgate.ops import operator_ab
    from rowgate.ops.cases import Case
    from rowgate.ops.contract import Operator
    from rowgate.ops.sandboxed import KernelChild

    runs, cubin, manifest = _pagedmini(ns.out, ns.nvcc)
    table = tomllib.loads(manifest.read_text())["operators"]["pm_paged_decode"]
    op = Operator.from_table("pm_paged_decode", table)
    case = Case(0, 16, "uniform", "16384", 64, "e5m2", 32, 8, 128, [16384] * 16)
    entries = op.entries(case.kv, case.dim, case.hq // case.hkv)
    pairs: list[dict[str, dict[str, float]]] = []
    for r in range(ns.rounds):
        medians: dict[str, dict[str, float]] = {}
        for confined in ((True, False) if r % 2 == 0 else (False, True)):
            with KernelChild(confined=confined) as child:
                rec = operator_ab.time_case(case, {"": cubin}, entries, op, 9, child=child)
            medians["inside" if confined else "outside"] = {
                role: statistics.median(s) for role, s in rec["samples_us"].items()}
        pairs.append(medians)
        print(f"round {r}: {json.dumps(medians)}", flush=True)
    doc: dict[str, Any] = {
        "workload": f"operator gate timing: pagedmini {case.name}, baseline and candidate, "
                    f"9 interleaved samples each, L2 flushed, a fresh kernel child per side",
        "rounds": ns.rounds, "sandbox": sandbox.describe(gpu=True), "cubin": str(cubin),
        "pairs_us": pairs,
        "gates": {name: {"bundle": run["bundle"], "returncode": run["returncode"],
                         "operator": run["gates"].get("operator")} for name, run in runs.items()}}
    for role in entries if len(pairs) > 1 else ():
        doc[role] = _summary([p["inside"][role] / p["outside"][role] for p in pairs])
    return doc


LISTEN = {
    "socket": "--uds {socket}: both sides serve on their own Unix socket, nothing relayed",
    "port": "--port {port}: confined behind the in-namespace relay, unconfined on the "
            "host's loopback"}


def _throughput(ns: argparse.Namespace) -> dict[str, Any]:
    import shutil

    from rowgate.engines.openai import OpenAIEngine
    from rowgate.models.tiny import build_tiny_model
    from rowgate.rows.requests import Request, WorkloadPass

    model = build_tiny_model(root=ns.out / "models")
    subject = ns.out / "server-subject"
    subject.mkdir(exist_ok=True)
    server = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "openai_server.py"
    shutil.copy2(server, subject / server.name)
    listen = ["--uds", "{socket}"] if ns.listen == "socket" else ["--port", "{port}"]
    command = [sys.executable, server.name, "--model", "{model}", *listen,
               "--device", ns.device, "--max-num-seqs", str(ns.concurrency)]
    engines = {side: OpenAIEngine(command, model.path, device=ns.device, subject=subject)
               for side in ("inside", "outside")}
    engines["outside"].confined_server = False
    rng = np.random.default_rng(0)
    prompts = [tuple(int(t) for t in rng.integers(16, model.vocab_size - 16, ns.input_len))
               for _ in range(ns.concurrency)]
    work = WorkloadPass(cell="aa", concurrency=ns.concurrency, requests=tuple(
        Request(id=f"aa-r{i}", cell="aa", prompt_ids=p, max_tokens=ns.output_len, seed=0)
        for i, p in enumerate(prompts)))
    tokens = ns.concurrency * ns.output_len
    pairs: list[dict[str, float]] = []
    try:
        for engine in engines.values():
            engine.start()
            engine.generate(work)  # warm-up: allocator, kernels, the bridge's first bytes
        described = {side: e.describe() for side, e in engines.items()}  # while serving
        start = time.monotonic()
        for r in range(ns.rounds):
            if ns.budget_s and time.monotonic() - start > ns.budget_s:
                break  # the rounds so far make the figure; a killed run would make none
            order = ("inside", "outside") if r % 2 == 0 else ("outside", "inside")
            wall = dict.fromkeys(order, 0.0)
            for i in range(ns.passes):  # interleaved A B, B A, …: a host-state switch
                for side in (order if i % 2 == 0 else order[::-1]):  # lands on both sides
                    wall[side] += engines[side].generate(work).wall_s
            rate = {side: ns.passes * tokens / wall[side] for side in order}
            pairs.append(rate)
            print(f"round {r}: {json.dumps(rate)}", flush=True)
    finally:
        for engine in engines.values():
            engine.stop()
    doc: dict[str, Any] = {
        "workload": f"OpenAI fixture server (tests/fixtures/openai_server.py) on the tiny "
                    f"model, {ns.device}, {LISTEN[ns.listen]}: {ns.concurrency} streams x "
                    f"{ns.output_len} output "
                    f"tokens after {ns.input_len}-token prompts; output tokens/s over "
                    f"{ns.passes} interleaved pass(es) per side per round",
        "rounds": len(pairs), "passes_per_round": ns.passes,
        "sandbox": sandbox.describe(gpu=ns.device.startswith("cuda")),
        "engines": described,
        "inside_tok_s_median": statistics.median(p["inside"] for p in pairs),
        "outside_tok_s_median": statistics.median(p["outside"] for p in pairs),
        "pairs_tok_s": pairs}
    if len(pairs) > 1:
        doc.update(_summary([p["inside"] / p["outside"] for p in pairs]))
    return doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--workload", choices=("matmul", "operator", "throughput"), default="matmul")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--nvcc", default=None)
    ap.add_argument("--device", default="cuda", help="throughput: the servers' device")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--listen", choices=sorted(LISTEN), default="socket",
                    help="throughput: where the server listens (its command's placeholder)")
    ap.add_argument("--budget-s", type=float, default=0.0,
                    help="throughput: start no round after this many seconds of rounds "
                         "(0: run --rounds)")
    ap.add_argument("--passes", type=int, default=1,
                    help="throughput: passes per side per round, interleaved (A B, B A, …)")
    ns = ap.parse_args()
    ns.out.mkdir(parents=True, exist_ok=True)
    if ns.workload == "throughput":
        doc = _throughput(ns)
        (ns.out / "sandbox-overhead-throughput.json").write_text(json.dumps(doc, indent=1) + "\n")
        print(json.dumps({k: v for k, v in doc.items() if k != "pairs_tok_s"}, indent=1))
        return
    if ns.workload == "operator":
        doc = _operator(ns)
        (ns.out / "sandbox-overhead-operator.json").write_text(json.dumps(doc, indent=1) + "\n")
        print(json.dumps({k: v for k, v in doc.items() if k != "pairs_us"}, indent=1))
        return
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "workload.py"
        script.write_text(WORKLOAD)
        pairs = []
        for r in range(ns.rounds):
            order = (True, False) if r % 2 == 0 else (False, True)
            ms = {confined: _time(script, confined, ns.size, ns.iters) for confined in order}
            pairs.append((ms[True], ms[False]))
            print(f"round {r}: inside {ms[True]:.4f} ms, outside {ms[False]:.4f} ms", flush=True)
    ratios = np.array([i / o for i, o in pairs])
    ci = stats.bootstrap((ratios,), np.median, confidence_level=0.95, random_state=0,
                         method="percentile").confidence_interval
    doc = {"workload": f"bf16 matmul {ns.size}x{ns.size}, {ns.iters} iterations, CUDA events",
           "rounds": ns.rounds, "sandbox": sandbox.describe(gpu=True),
           "inside_ms_median": statistics.median(p[0] for p in pairs),
           "outside_ms_median": statistics.median(p[1] for p in pairs),
           "ratio_median": float(np.median(ratios)), "ratio_ci95": [ci.low, ci.high],
           "pairs_ms": pairs}
    (ns.out / "sandbox-overhead.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({k: v for k, v in doc.items() if k != "pairs_ms"}, indent=1))


if __name__ == "__main__":
    main()
