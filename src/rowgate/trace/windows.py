"""Matched correctness windows for the trace gate (MLPerf TEST06's idea).

A traced pass is only evidence about the engine whose tokens are right: the tokens
each capture's timed pass produced (`capture.json` `timed_outputs`, one per timed
request, over the prompts named by `prompt_sources`: the ids of the workload
requests the prompts came from) are compared with the tokens gate's pass of the same
requests by the same arm (`artifacts/<tokens gate>/<arm>.jsonl`), prefix-wise, with
the tokens gate's near-tie rule (`rowgate.engines.divergence.matched_windows`). A capture
whose tokens differ refuses the trace. Where there is nothing to compare with (no
tokens gate in the row, its artifacts absent, an arm the tokens gate does not run,
a sampled workload) the capture says why and counts as unchecked.

Pure: reads sealed artifacts only (this gate's and the tokens gate's beside it).
"""

from __future__ import annotations

import json
from collections.abc import Hashable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rowgate.engines.divergence import Out, matched_windows
from rowgate.rows.spec import MAIN_ARMS

if TYPE_CHECKING:
    from rowgate.rows.row import Row


def _outputs(path: Path) -> dict[Hashable, Out] | None:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    out: dict[Hashable, Out] = {}
    for line in lines:
        if line.strip():
            doc = json.loads(line)
            out[doc["id"]] = Out.from_json(doc)
    return out


def _tokens_gate(row: Row) -> tuple[str, float] | None:
    spec = next((g for g in row.gates if getattr(g, "kind", "") == "tokens"), None)
    return (spec.id, float(getattr(spec, "tie_margin", 0.0))) if spec else None


def check(row: Row, record: dict[str, Any], arm: str, artifact_dir: Path, gate_id: str
          ) -> dict[str, Any]:
    """One capture's window against the tokens gate's pass of the same arm (`gate_id`:
    the trace gate's)."""
    gate = _tokens_gate(row)
    if gate is None:
        return {"checked": False, "why": "the row has no tokens gate to match the traced "
                                         "tokens against"}
    if row.workload.sampling.temperature > 0:
        return {"checked": False, "why": "a sampled workload: the traced (greedy) pass has "
                                         "no correctness pass of the same sampling"}
    if arm not in MAIN_ARMS:
        return {"checked": False, "why": f"arm {arm!r} has no tokens-gate pass (the tokens "
                                         f"gate runs oracle and candidate)"}
    # A tokens gate after this one had left nothing when this gate ran: the same reason
    # as outputs absent, word for word, so a sealed bundle re-derives as it was sealed.
    earlier = {g.id for g in row.gates_before(gate_id)}
    correct = (_outputs(artifact_dir.parent / gate[0] / f"{arm}.jsonl")
               if gate[0] in earlier else None)
    if correct is None:
        return {"checked": False, "why": f"no {arm} outputs of gate {gate[0]} in this bundle "
                                         f"(it did not run here)"}
    sources = record.get("prompt_sources") or []
    timed = record.get("timed_outputs") or []
    if not sources or len(sources) != len(timed):
        return {"checked": True, "matched": False, "requests": len(timed),
                "mismatched_requests": len(timed) or 1, "first_mismatch": {
                    "why": "the capture record pairs no traced request with a workload request"}}
    window: dict[Hashable, Out] = {src: Out.from_json(o) for src, o in zip(sources, timed)}
    return {"checked": True, **matched_windows(correct, window, gate[1])}


def summary(docs: dict[str, dict[str, Any]]) -> tuple[dict[str, Any], list[str]]:
    """Gate-level window metrics over every capture, and one problem per refused one."""
    checked = {name: d for name, d in docs.items() if d["checked"]}
    problems = []
    for name, d in checked.items():
        if not d["matched"]:
            f = d.get("first_mismatch") or {}
            where = (f"request {f['request']} position {f['position']}: correctness token "
                     f"{f['correctness']}, traced token {f['window']}" if "position" in f
                     else f.get("why") or f"request {f.get('request')} unmatched")
            problems.append(f"{name}: traced tokens differ from the correctness pass "
                            f"({d['mismatched_requests']} request(s); first at {where})")
    metrics = {"windows_checked": len(checked),
               "windows_compared": sum(d.get("compared", 0) for d in checked.values()),
               "windows_mismatched": sum(d["mismatched_requests"] for d in checked.values())
               if checked else None}
    return metrics, problems
