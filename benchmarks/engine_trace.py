"""Trace an engine rowgate does not run itself: the OpenAI fixture server, through its
own profiler (vLLM's convention), with the trace gate's procedure and judgement.

    # on the H200 (everything lands in $OUT: the tarball, the summary, the log)
    python3 benchmarks/engine_trace.py --device cuda --out "$OUT"
    # here, on a CPU: the same path on the tiny model, small plan
    python benchmarks/engine_trace.py --smoke --out /tmp/engine-trace

The fixture (tests/fixtures/openai_server.py: its own plain-torch Qwen3 forward,
its own scheduler, `/start_profile` / `/stop_profile`, traces to
VLLM_TORCH_PROFILER_DIR) serves the megakernel row's probe model (Qwen3, 16 layers,
hidden 2048, bf16, built here from a fixed seed) on the GPU, or the tiny model in
float32 on a CPU. rowgate starts it on loopback and captures one range with the
megakernel row's procedure counted in the server's iterations: warm c1, arm at
257, a 256-iteration c1 primer, 32 timed decode iterations (`--smoke`: primer 16,
delay 17, 4 steps). Then, from the files the server wrote:

* validity: one trace file, armed with the declared delay, recording began with
  the timed pass, the timed decode steps, no primer work, stable clocks (NVML,
  sampled in this process), kernel launch arguments;
* the four measures: launch gaps / idle breakdown, wave tails, achieved bandwidth
  against the copy ceiling, recoverable idle capacity and its verdict;
* seams: the server's forward range (`gpu_model_runner: forward`) and, on a GPU,
  GEMM kernels (`gemm|gemv|xmma|cutlass`), each with the share of step time it covers.

`--out` gets `engine-trace.tar.gz` (the capture directory with the raw trace,
phases, clocks, capture record and the reviewer files) and `summary.json`;
the summary is printed too.
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from rowgate.trace import captures
from rowgate.trace.capture import CapturePlan
from rowgate.trace.seams import Seam

ROOT = Path(__file__).resolve().parent.parent

SERVER = ROOT / "tests" / "fixtures" / "openai_server.py"
FULL = dict(primer_steps=256, primer_concurrency=1, arm_delay=257, steps=32, concurrency=1)
SMOKE = dict(primer_steps=16, primer_concurrency=1, arm_delay=17, steps=4, concurrency=1)
SEAMS = (Seam("gpu_model_runner: forward", "range"),)
GPU_SEAMS = (Seam("gemm kernels", "kernel", r"(?i)gemm|gemv|xmma|cutlass"),)


def model(device: str):
    from rowgate.models.tiny import build_tiny_model

    if device == "cpu":
        return build_tiny_model(), "float32"
    from rowgate_lab.megakernel.models import NAMED

    return build_tiny_model(NAMED["probe-qwen3-h2048-l16"]), "bfloat16"


def prompts(info, n: int = 4) -> list[tuple[int, ...]]:
    from rowgate.rows.spec import Workload
    from rowgate.rows.workload import build_passes

    work = Workload(input_lens=[128], concurrency=[1], output_len=1, requests_per_cell=n)
    return [r.prompt_ids for p in build_passes(work, info.vocab_size, info.special_ids)
            for r in p.requests]


def run(device: str, plan: dict, work: Path) -> dict:
    from rowgate.engines.openai import OpenAIEngine
    from rowgate.trace.engine_capture import capture_engine

    info, dtype = model(device)
    gpu = 0 if device.startswith("cuda") else None
    server = OpenAIEngine([sys.executable, str(SERVER), "--model", "{model}", "--port",
                           "{port}", "--device", "cuda" if gpu is not None else "cpu",
                           "--dtype", dtype], info.path, device=device)
    t0 = time.time()
    record = capture_engine(server, prompts(info), CapturePlan(**plan),
                            work / "fixture-eager", device, gpu)
    judging = captures.Judging(arm_delay=plan["arm_delay"], steps=plan["steps"],
                               clock_tolerance=0.02, material_idle_fraction=0.10,
                               seams=(("fixture", SEAMS + (GPU_SEAMS if gpu is not None
                                                           else ())),))
    results = captures.analyse(judging, work, [("fixture", "eager")])
    captures.write_reviewer_files(results, work, "engine-trace")
    s = captures.summarize(results, judging)
    r = results[0]
    return {"device": device, "model": str(info.path), "model_digest": info.digest,
            "dtype": dtype, "plan": plan, "capture_s": round(time.time() - t0, 1),
            "trace_files": record["trace_files"], "engine": record["engine"],
            "ok": s.ok, "reason": s.reason, "validity": r.validity.reason(),
            "headline": captures.headline(r.analysis) if r.analysis else None,
            "launches": r.analysis.launches if r.analysis else None,
            "waves": r.analysis.waves if r.analysis else None,
            "bandwidth": r.analysis.bandwidth if r.analysis else None,
            "capacity": r.analysis.capacity if r.analysis else None,
            "seams": list(r.seams), "metrics": s.metrics}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--smoke", action="store_true", help="small plan (CPU: always)")
    p.add_argument("--out", type=Path, help="write engine-trace.tar.gz and summary.json here")
    ns = p.parse_args(argv)
    device = "cuda:0" if ns.device.startswith("cuda") else "cpu"
    plan = SMOKE if ns.smoke or device == "cpu" else FULL
    with tempfile.TemporaryDirectory(prefix="rowgate-engine-trace-") as tmp:
        summary = run(device, plan, Path(tmp))
        if ns.out:
            ns.out.mkdir(parents=True, exist_ok=True)
            with tarfile.open(ns.out / "engine-trace.tar.gz", "w:gz") as tar:
                tar.add(Path(tmp) / "fixture-eager", arcname="fixture-eager")
            (ns.out / "summary.json").write_text(json.dumps(summary, indent=1, default=str)
                                                 + "\n")
    print(json.dumps(summary, indent=1, default=str))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
