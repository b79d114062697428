"""On a GPU, in one call: `rowgate gate` on an external subject (pagedmini, the
fixture of tests/fixtures/subjects/paged_decode, made a real repository here), on the same
subject with a planted last-page bug in its candidate, and on rowgate's own tree (its
split_kv, split_kv_bulk and split_kv_deep operators, the kept candidates), and on pagedv
(tests/fixtures/subjects/vllm_paged: a kernel in vLLM's own cache layout gated through its
harness, harness/1) clean and with a planted prefetch bug: the same rows, the same gates,
the same path. Then what each run must show is checked.

    PYTHONPATH=. python3 benchmarks/subject_gates.py --out DIR [--nvcc PATH] [--smoke] \
        [--only NAME ...]

Writes DIR/summary.json (per run: each gate's status and reason, the expectation and
whether it held), DIR/gate-log-NAME.txt, and the sealed evidence under DIR/evidence/.
The planted-bug run uses the row without its phase and AOT gates (the operator gate is
what must catch it).
`--smoke` runs the same on a machine without a GPU: every execution gate must then be
PENDING with its reason (a CPU check of this script). `--only pagedmini` runs one of
them (pagedmini, pagedmini-bug, rowgate, pagedv, pagedv-bug), e.g. to re-seal a checked-in
bundle.
Exit 0 when every expectation holds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

ROWS = REPO / "tests" / "data" / "rows"
PAGEDMINI_ROW = ROWS / "SUBJECT-PAGEDMINI-SM90.toml"
ROWGATE_ROW = ROWS / "SUBJECT-ROWGATE-SM90.toml"
PAGEDV_ROW = ROWS / "SUBJECT-PAGEDV-SM90.toml"
GATE_TIMEOUT_S = int(os.environ.get("GATE_TIMEOUT", "300"))
BUG_CASE = re.compile(r"first (\S+-uniform-page-s0)\b")
"""The planted bug drops the last page when a length is a multiple of the page: the first
failing case is the first uniform one whose context is exactly one page."""
PAGEDV_BUG_CASE = re.compile(r"first (\S+-uniform-page-s0)\b")
"""pagedv's planted prefetch bug drops the last block when a length fills it exactly."""


def operator_only(row: Path, out: Path) -> Path:
    """The row with its phase and AOT gates (and their criteria) left out: the
    planted-bug run needs the operator gate alone, the same cases, half the time."""
    blocks: list[list[str]] = [[]]
    for line in row.read_text().splitlines():
        if line.startswith("[[") or (line.startswith("[") and not line.startswith("[gates.")):
            blocks.append([])
        blocks[-1].append(line)
    dropped = ('kind = "phase"', 'kind = "aot"', 'gate = "phase"', 'gate = "triton-aot"')
    kept = ["\n".join(b) for b in blocks if not any(d in b for d in dropped)]
    trimmed = out / row.name.replace(".toml", "-OPERATOR.toml")
    trimmed.write_text("\n".join(kept).replace(f'id = "{row.stem}"', f'id = "{trimmed.stem}"', 1)
                       + "\n")
    return trimmed


def gate(name: str, row: Path, subject: Path, out: Path, nvcc: str | None) -> dict:
    argv = [sys.executable, "-m", "rowgate.cli.main", "gate", str(row), "--repo", str(subject),
            "--out", str(out / "evidence")]
    if nvcc:
        argv += ["--option", f"nvcc={nvcc}"]
    start = time.time()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=GATE_TIMEOUT_S,
                              env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                                  p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)))
        rc, log = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc, log = 124, f"{exc.stdout or ''}{exc.stderr or ''}\ntimed out after {GATE_TIMEOUT_S}s"
    (out / f"gate-log-{name}.txt").write_text(" ".join(argv) + "\n" + log)
    bundle = next((Path(line.strip()) for line in reversed(log.splitlines())
                   if line.strip().startswith(str(out / "evidence"))), None)
    results = {}
    if bundle is not None and (bundle / "gates").is_dir():
        for f in sorted((bundle / "gates").glob("*.json")):
            r = json.loads(f.read_text())
            results[r["gate_id"]] = {"status": r["status"], "reason": r["reason"],
                                     "arch": r.get("arch"), "metrics": r.get("metrics", {})}
    return {"argv": argv, "returncode": rc, "seconds": round(time.time() - start, 1),
            "bundle": str(bundle) if bundle else None, "gates": results}


def expect(run: dict, gate_id: str, status: str, *, reason: re.Pattern | None = None,
           metrics: list[str] = ()) -> dict:
    got = run["gates"].get(gate_id)
    ok = got is not None and got["status"] == status
    why = "" if got else "no result"
    if ok and reason is not None and not reason.search(got["reason"]):
        ok, why = False, f"reason does not match {reason.pattern!r}"
    missing = [m for m in metrics if got is None or not any(
        k == m or k.startswith(m) for k in got["metrics"])]
    if ok and missing:
        ok, why = False, f"metrics missing: {', '.join(missing)}"
    return {"gate": gate_id, "expected": status, "got": got and got["status"],
            "reason": got and got["reason"], "ok": ok, "why": why}


SUBJECTS = ("pagedmini", "pagedmini-bug", "rowgate", "pagedv", "pagedv-bug")


def subject(name: str, out: Path) -> tuple[Path, Path]:
    """The row and the subject repository (made under out/subjects/) of subject `name`."""
    from tests.subjects import paged_decode_subject, snapshot_of, vllm_paged_subject

    work = out / "subjects"
    if name == "rowgate":
        return ROWGATE_ROW, snapshot_of(REPO, work / "rowgate")
    if name.startswith("pagedv"):
        bug = name == "pagedv-bug"
        return PAGEDV_ROW, Path(vllm_paged_subject(work / name, planted_bug=bug).working_dir)
    bug = name == "pagedmini-bug"
    repo = Path(paged_decode_subject(work / name, planted_bug=bug).working_dir)
    return (operator_only(PAGEDMINI_ROW, out) if bug else PAGEDMINI_ROW), repo


def expectations(name: str, run: dict, device: str | None) -> list[dict]:
    """What the run of subject `name` must show (`device` "PENDING" on a machine
    without a GPU, where every execution gate is PENDING)."""
    if name == "pagedmini":
        return [expect(run, g, "PASS") for g in ("host", "build", "audit")] + [
            expect(run, "operator", device or "PASS"),
            expect(run, "phase", device or "PASS",
                   metrics=[] if device else ["counter_baseline_", "v_load_us_baseline"]),
            expect(run, "triton-aot", "PASS")]
    if name == "pagedmini-bug":
        return [expect(run, "operator", device or "FAIL", reason=None if device else BUG_CASE)]
    if name == "pagedv":
        return [expect(run, g, "PASS") for g in ("host", "build", "audit")] + [
            expect(run, "operator", device or "PASS")]
    if name == "pagedv-bug":
        return [expect(run, "operator", device or "FAIL",
                       reason=None if device else PAGEDV_BUG_CASE)]
    return [expect(run, g, "PASS") for g in ("host", "build", "audit")] + [
        expect(run, g, device or "PASS") for g in ("operator", "operator-bulk", "operator-deep")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--nvcc", default=shutil.which("nvcc"))
    ap.add_argument("--smoke", action="store_true", help="no GPU: execution gates PENDING")
    ap.add_argument("--only", action="append", choices=SUBJECTS, default=[],
                    help="run only this subject (repeatable; default: all)")
    ns = ap.parse_args(argv)
    ns.out.mkdir(parents=True, exist_ok=True)
    chosen = ns.only or list(SUBJECTS)
    runs = {name: gate(name, *subject(name, ns.out), ns.out, ns.nvcc) for name in chosen}
    device = "PENDING" if ns.smoke else None
    checks = {name: expectations(name, runs[name], device) for name in chosen}
    ok = all(c["ok"] for cs in checks.values() for c in cs)
    (ns.out / "summary.json").write_text(json.dumps({"ok": ok, "runs": runs, "checks": checks},
                                                    indent=1) + "\n")
    for name, cs in checks.items():
        for c in cs:
            mark = "ok  " if c["ok"] else "FAIL"
            print(f"{mark} {name:14} {c['gate']:10} expected {c['expected']:7} got {c['got']}: "
                  f"{(c['reason'] or '')[:160]} {c['why']}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
