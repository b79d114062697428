"""Accuracy gate: GSM8K-style health and accuracy with the row's own sampling.

The dataset is a local JSONL file the row names (`dataset_path`), one
`{"question": ..., "answer": "... #### 42"}` per line, as GSM8K ships it;
nothing is downloaded. The candidate arm answers the first `num_questions`
with `spec.sampling` (e.g. temperature 1.0, top-k 20, top-p 0.95, natural
EOS) and at most `max_tokens` tokens.

* Health runs on any model: empty outputs, runaway outputs (hit `max_tokens`
  without EOS), EOS rate; thresholds `max_empty_rate` / `max_runaway_rate`.
* Accuracy (exact match of the last number in the output with the number
  after `####`) needs the row's real weights (`spec.weights`): without them the
  gate is PENDING after health, saying which of weights / dataset is missing.
  Health FAIL is FAIL whatever the weights.
* `health_only = true` judges health alone: PASS when healthy, the reason saying
  accuracy was not judged and how many final numbers equal the reference (for a
  model trained on the questions, e.g. the demo's, that is recall, not accuracy).

Prompt format (plain completion, zero-shot, recorded in meta.json):
`Question: <question>\\nAnswer:`.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, cast

from pydantic import Field

import rowgate.gates.arms as _arms
from rowgate.engines.interface import PassResult, Request, WorkloadPass
from rowgate.gates.artifacts import read_json, read_jsonl, write_json
from rowgate.gates.interface import Derived, Gate, GateContext, GateError, gate_arch
from rowgate.models.train import PROMPT_FORMAT
from rowgate.records.status import Status
from rowgate.rows.options import ENGINE_KEYS
from rowgate.rows.spec import Arm, GateSpec, Sampling

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from rowgate.rows.row import Row

META = "meta.json"
OUTPUTS = "outputs.jsonl"
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


class AccuracyGate(GateSpec):
    kind: Literal["accuracy"]
    dataset: str
    dataset_path: str = ""
    weights: str = ""
    sampling: Sampling
    num_questions: Annotated[int, Field(gt=0)] = 1319
    max_tokens: Annotated[int, Field(gt=0)] = 1024
    max_empty_rate: Annotated[float, Field(ge=0, le=1)] = 0.0
    """Health: largest fraction of outputs with no token before EOS."""
    max_runaway_rate: Annotated[float, Field(ge=0, le=1)] = 0.05
    """Health: largest fraction of outputs that hit max_tokens without EOS."""
    health_only: bool = False
    """Judge health alone (PASS when healthy) and say accuracy was not judged: for a
    model whose accuracy would mean nothing, e.g. the demo's tiny model trained on the
    very questions it is asked (it can only recite them)."""


def dataset_file(spec: AccuracyGate, repo: Path) -> Path | None:
    if not spec.dataset_path:
        return None
    path = Path(spec.dataset_path)
    return path if path.is_absolute() else repo / path


def dataset_missing(spec: AccuracyGate, repo: Path) -> str | None:
    path = dataset_file(spec, repo)
    if path is None:
        return f"dataset {spec.dataset}: the row names no local dataset_path"
    if not path.is_file():
        return f"dataset {spec.dataset}: {path} is not on this machine"
    return None


def weights_missing(spec: AccuracyGate) -> str | None:
    if not spec.weights:
        return "weights: the row names no local weights path (spec.weights)"
    if not (Path(spec.weights) / "config.json").is_file():
        return f"weights: {spec.weights} is not on this machine"
    return None


def load_questions(path: Path, limit: int) -> list[dict[str, Any]]:
    """The first `limit` {question, answer} records; one clear line per bad line."""
    out = []
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise GateError(f"dataset {path}: cannot read ({exc})") from exc
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            question, answer = rec["question"], rec["answer"]
        except (ValueError, KeyError, TypeError) as exc:
            raise GateError(f"dataset {path}:{n}: expected a JSON object with question and "
                            f"answer ({exc.__class__.__name__}: {exc})") from exc
        if gold_number(answer) is None:
            raise GateError(f"dataset {path}:{n}: answer has no number after '####'")
        out.append({"question": question, "answer": answer})
        if len(out) == limit:
            break
    if not out:
        raise GateError(f"dataset {path}: no questions")
    return out


def _normalise(text: str) -> str:
    value = text.replace(",", "").rstrip(".")
    if "." in value:
        value = value.rstrip("0").rstrip(".")
    return value


def gold_number(answer: str) -> str | None:
    """GSM8K's final answer: the number after `####`."""
    _, sep, tail = answer.rpartition("####")
    found = NUMBER.search(tail) if sep else None
    return _normalise(found.group()) if found else None


def predicted_number(text: str) -> str | None:
    """The last number in a model's output (GSM8K's usual extraction)."""
    found = NUMBER.findall(text)
    return _normalise(found[-1]) if found else None


class Accuracy(Gate[AccuracyGate]):
    kind = "accuracy"
    drives_arms = True
    shares_engines = True
    spec_model = AccuracyGate
    needs_device = True
    options = ENGINE_KEYS

    def requirements(self, row: Row, spec: AccuracyGate, ctx: GateContext) -> str | None:
        missing = dataset_missing(spec, ctx.repo)
        model = None if not weights_missing(spec) else _arms.model_requirement(row)
        if missing and model:
            return f"{missing}; {model}"
        return missing or model

    def arch(self, row: Row, spec: AccuracyGate, ctx: GateContext) -> tuple[str, bool]:
        return gate_arch(row, ctx.gpu)

    # ------------------------------------------------------------- measure

    def pooled_arms(self, row: Row, spec: AccuracyGate) -> list[Arm]:
        return [row.arms.candidate]

    def measure(self, row: Row, spec: AccuracyGate, ctx: GateContext) -> None:
        from rowgate.models.tiny import model_info

        pending = weights_missing(spec)
        path = dataset_file(spec, ctx.repo)
        if path is None:  # requirements() has made the gate PENDING already
            raise GateError(f"dataset {spec.dataset}: the row names no local dataset_path")
        with ctx.phase("model"):  # the model, its tokenizer, the questions put in its words
            model = _arms.resolve_model(row) if pending else model_info(Path(spec.weights))
            questions = load_questions(path, spec.num_questions)
            tokenizer = _tokenizer(model.path)
            work = _work(row, spec, questions, tokenizer)
        with _arms.started({"candidate": (row.arms.candidate, model)}, row,
                           ctx) as engines:
            ctx.progress.update(f"accuracy: {len(questions)} questions, candidate arm")
            with ctx.phase("generate"):
                result = cast(PassResult, _arms.generate(engines["candidate"], "candidate",
                                                         work))
            engine = engines["candidate"].describe()
        with open(ctx.artifact_dir / OUTPUTS, "w") as f:
            for q, req, out in zip(questions, work.requests, result.outputs):
                f.write(json.dumps({"id": out.id, "gold": q["answer"],
                                    "prompt_tokens": len(req.prompt_ids),
                                    "token_ids": list(out.token_ids),
                                    "text": tokenizer.decode(list(out.token_ids))}) + "\n")
        write_json(ctx.artifact_dir / META, {
            "engine": engine, "model_digest": model.digest, "eos_token_id": model.eos_token_id,
            "dataset": spec.dataset, "dataset_path": str(path),
            "dataset_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "prompt_format": PROMPT_FORMAT, "max_tokens": spec.max_tokens,
            "sampling": spec.sampling.model_dump(), "concurrency": work.concurrency,
            "accuracy_pending": pending or ""})

    # -------------------------------------------------------------- derive

    def derive(self, row: Row, spec: AccuracyGate, artifact_dir: Path) -> Derived:
        meta = read_json(artifact_dir / META)
        outputs = read_jsonl(artifact_dir / OUTPUTS)
        metrics = health(outputs, meta["eos_token_id"], meta["max_tokens"])
        text = (f"health on {len(outputs)} questions: {metrics['empty']} empty, "
                f"{metrics['runaway']} runaway (hit max_tokens {meta['max_tokens']}), "
                f"EOS rate {metrics['eos_rate']:.3f}")
        problems = []
        if metrics["empty_rate"] > spec.max_empty_rate:
            problems.append(f"empty rate {metrics['empty_rate']:.3f} > {spec.max_empty_rate}")
        if metrics["runaway_rate"] > spec.max_runaway_rate:
            problems.append(f"runaway rate {metrics['runaway_rate']:.3f} > "
                            f"{spec.max_runaway_rate}")
        if problems:
            return Derived(Status.FAIL, f"unhealthy: {'; '.join(problems)} ({text})", metrics)
        correct = sum(predicted_number(o["text"]) == gold_number(o["gold"]) for o in outputs)
        if spec.health_only:
            metrics["matches_reference"] = correct
            return Derived(Status.PASS, f"healthy: {text}; accuracy not judged (health_only): "
                                        f"{correct}/{len(outputs)} final numbers equal the "
                                        f"reference's", metrics)
        if meta["accuracy_pending"]:
            # A PENDING result carries no metrics; the health numbers stay in the reason.
            return Derived(Status.PENDING, f"accuracy PENDING: {meta['accuracy_pending']}; "
                                           f"{text}: healthy")
        metrics.update(correct=correct, accuracy=round(correct / len(outputs), 9))
        return Derived(Status.PASS, f"accuracy {correct}/{len(outputs)} = "
                                    f"{metrics['accuracy']:.4f}; {text}", metrics)


def health(outputs: list[dict[str, Any]], eos: int, max_tokens: int) -> dict[str, Any]:
    """Empty, runaway and EOS counts and rates over the outputs."""
    n = len(outputs)
    if n == 0:
        raise GateError(f"{OUTPUTS}: no outputs")
    ended_eos = [bool(o["token_ids"]) and o["token_ids"][-1] == eos for o in outputs]
    content = [[t for t in o["token_ids"] if t != eos] for o in outputs]
    empty = sum(not c for c in content)
    runaway = sum(len(o["token_ids"]) >= max_tokens and not e
                  for o, e in zip(outputs, ended_eos))
    eos_count = sum(ended_eos)
    return {"questions": n, "empty": empty, "runaway": runaway, "ended_by_eos": eos_count,
            "empty_rate": round(empty / n, 9), "runaway_rate": round(runaway / n, 9),
            "eos_rate": round(eos_count / n, 9),
            "mean_output_tokens": round(sum(len(o["token_ids"]) for o in outputs) / n, 6)}


def _tokenizer(model_dir: Path) -> Tokenizer:
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    except Exception as exc:  # tokenizers raises a bare Exception on a bad file
        raise GateError(f"model {model_dir}: cannot load tokenizer.json ({exc})") from exc


def _work(row: Row, spec: AccuracyGate, questions: list[dict[str, Any]],
          tokenizer: Tokenizer) -> WorkloadPass:
    seed = row.workload.seeds[0] if row.workload.seeds else 0
    requests = []
    for i, q in enumerate(questions):
        ids = tokenizer.encode(PROMPT_FORMAT.format(question=q["question"])).ids
        requests.append(Request(id=f"{spec.dataset}-q{i}", cell=spec.dataset,
                                prompt_ids=tuple(ids), max_tokens=spec.max_tokens,
                                seed=seed + i))
    s = spec.sampling
    return WorkloadPass(cell=spec.dataset, concurrency=max(row.workload.concurrency),
                        requests=tuple(requests), temperature=s.temperature, top_k=s.top_k,
                        top_p=s.top_p, ignore_eos=s.ignore_eos, prefix_caching=False)
