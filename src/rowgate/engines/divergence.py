"""Where two greedy runs of one request part: exact, a near-tie kept the other way, or a
real mismatch (the rule of vLLM's `check_logprobs_close`).

Two correct paths that round differently (bf16 sums in another order, another
engine's kernels, bf16 against fp32) cannot be held to identical tokens over a long
greedy run: where the top logits tie within their rounding noise each path may keep a
different one, and from there their histories differ. So at the first divergence:

* tie: each path's token is among the other's most likely alternatives (the engine
  records them per token), within `margin` nats of that path's own choice; tokens
  after it are not compared;
* mismatch: anything else, or either side without alternatives there.

The abi gate's proof (persistent vs eager) and the tokens gate (candidate vs oracle,
`tie_margin`) share it.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any

from rowgate.engines.interface import Alternatives, alternatives_from_json


@dataclass(frozen=True)
class Out:
    """One request's greedy output as compared here."""

    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    alternatives: Alternatives

    @classmethod
    def of(cls, o: Any) -> "Out":
        """From an engine's RequestOutput."""
        return cls(tuple(o.token_ids), tuple(o.logprobs), tuple(o.alternatives))

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Out":
        """From a tokens artifact / oracle record line (`token_ids`, `logprobs`,
        optional `alternatives`)."""
        return cls(tuple(d["token_ids"]), tuple(d["logprobs"]),
                   alternatives_from_json(d.get("alternatives", ())))

    def gap_to(self, pos: int, token: int) -> float | None:
        """How many nats below this path's own choice `token` was at `pos` (None: not
        among the alternatives kept)."""
        if pos >= len(self.alternatives) or pos >= len(self.logprobs):
            return None
        return next((self.logprobs[pos] - lp for i, lp in self.alternatives[pos] if i == token),
                    None)


def divergence(want: Out, got: Out, margin: float,
               names: tuple[str, str] = ("want", "got")) -> dict[str, Any] | None:
    """None when the tokens are equal; else where they part and whether it is a tie.
    `names` label the two sides in the returned document."""
    pos = next((i for i, (x, y) in enumerate(zip(want.tokens, got.tokens)) if x != y), None)
    if pos is None:
        if len(want.tokens) == len(got.tokens):
            return None
        pos = min(len(want.tokens), len(got.tokens))
    a = want.tokens[pos] if pos < len(want.tokens) else None
    b = got.tokens[pos] if pos < len(got.tokens) else None
    doc: dict[str, Any] = {"position": pos, names[0]: a, names[1]: b, "tie": False}
    if a is None or b is None:
        return doc
    gap_want, gap_got = want.gap_to(pos, b), got.gap_to(pos, a)
    doc.update({f"{names[0]}_gap": None if gap_want is None else round(gap_want, 6),
                f"{names[1]}_gap": None if gap_got is None else round(gap_got, 6)})
    doc["tie"] = (gap_want is not None and gap_got is not None
                  and gap_want <= margin and gap_got <= margin)
    return doc


def compare(want: list[Out], got: list[Out], margin: float,
            names: tuple[str, str] = ("want", "got")) -> dict[str, Any]:
    """Counts, every divergence, and the first real mismatch of paired requests."""
    parted = [(r, d) for r, d in enumerate(divergence(w, g, margin, names)
                                           for w, g in zip(want, got)) if d]
    mismatches = [{"request": r, **d} for r, d in parted if not d["tie"]]
    return {"requests": len(want), "exact_requests": len(want) - len(parted),
            "tie_requests": len(parted) - len(mismatches),
            "mismatched_requests": len(mismatches) + abs(len(want) - len(got)),
            "divergences": [{"request": r, **d} for r, d in parted],
            "first_divergence": mismatches[0] if mismatches else None}


def _head(o: Out, n: int) -> Out:
    return Out(o.tokens[:n], o.logprobs[:n], o.alternatives[:n])


def matched_windows(correct: Mapping[Hashable, Out], window: Mapping[Hashable, Out],
                    margin: float = 0.0) -> dict[str, Any]:
    """MLPerf TEST06's idea: the tokens a timed (throughput) or traced pass produced
    against the correctness (tokens gate) pass of the same requests.

    Requests are paired by key (a request id, or a prompt's token ids where the pass
    built its own requests over the workload's prompts). Each pair is compared over
    their common length — a greedy run's first n tokens are the n-token run of the
    same prompt — by `divergence`: exact, a near-tie within `margin` nats kept the
    other way, or a mismatch. A window request with no correctness counterpart is a
    mismatch too: its tokens were never checked. `matched` is True iff nothing
    mismatched; a caller refuses the timed or traced comparison otherwise.
    """
    docs, unmatched = [], []
    for key, got in window.items():
        want = correct.get(key)
        if want is None:
            unmatched.append(key)
            continue
        n = min(len(want.tokens), len(got.tokens))
        d = divergence(_head(want, n), _head(got, n), margin, ("correctness", "window"))
        if d:
            docs.append({"request": str(key) if not isinstance(key, tuple) else
                         f"prompt of {len(key)} tokens", **d})
    mismatches = [d for d in docs if not d["tie"]]
    first = mismatches[0] if mismatches else (
        {"request": str(unmatched[0]), "unmatched": True} if unmatched else None)
    return {"requests": len(window), "compared": len(window) - len(unmatched),
            "exact_requests": len(window) - len(unmatched) - len(docs),
            "tie_requests": len(docs) - len(mismatches),
            "mismatched_requests": len(mismatches) + len(unmatched),
            "unmatched_requests": len(unmatched), "first_mismatch": first,
            "matched": not mismatches and not unmatched}
