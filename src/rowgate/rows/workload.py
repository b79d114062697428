"""The identical workload both arms run: token-id prompts per matrix cell and its digest.

Prompts are token ids, never text, so no tokenizer can make two arms see
different inputs. With a dataset (`rowgate.rows.datasets`) they are the row's pinned
prompt file tokenized once with the model's tokenizer; otherwise random ids
derived from SHA-256 in counter mode (not from a seeded PRNG), so the same row
gives the same prompts on every Python, numpy or torch version. The digest
covers the canonical JSON of every pass (prompts, lengths, sampling, seeds,
prefix caching, the dataset); arms whose digests differ did not run the same
workload and cannot be compared.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from rowgate.errors import Error, UsageError
from rowgate.rows.requests import Request, WorkloadPass
from rowgate.rows.spec import Workload

DIGEST_VERSION = 1
"""Bumped whenever the prompt derivation or the canonical form changes."""


class WorkloadError(UsageError):
    """The workload cannot be built for this model (e.g. no usable token ids)."""


def _token_stream(label: str, count: int, allowed: Sequence[int]) -> tuple[int, ...]:
    """`count` ids from `allowed`, derived from sha256(label, block counter)."""
    out: list[int] = []
    block = 0
    while len(out) < count:
        digest = hashlib.sha256(f"rowgate-workload/{label}/{block}".encode()).digest()
        # 8 bytes per id: the modulo bias over a vocabulary of < 2**20 is < 2**-44.
        for i in range(0, len(digest), 8):
            if len(out) == count:
                break
            out.append(allowed[int.from_bytes(digest[i:i + 8], "big") % len(allowed)])
        block += 1
    return tuple(out)


def allowed_ids(vocab_size: int, special_ids: Iterable[int]) -> list[int]:
    """Prompt token ids: the vocabulary minus special / EOS ids."""
    excluded = set(special_ids)
    ids = [i for i in range(vocab_size) if i not in excluded]
    if not ids:
        raise WorkloadError(f"vocab_size {vocab_size}: no token ids left after excluding "
                            f"special ids {sorted(excluded)}")
    return ids


@dataclass(frozen=True)
class DatasetPrompts:
    """A row's prompt file, tokenized for the model (`rowgate.rows.datasets`)."""

    describe: tuple[tuple[str, str], ...]
    """What the digest records of the file: sha256, format, category, file name."""
    ids: tuple[tuple[int, ...], ...]
    """Each prompt text as token ids."""


def _prompt(input_len: int, r: int, seed: int, allowed: Sequence[int],
            dataset: DatasetPrompts | None) -> tuple[int, ...]:
    if dataset is None:
        return _token_stream(f"len={input_len}/req={r}/seed={seed}", input_len, allowed)
    from rowgate.rows.datasets import prompt

    return prompt([list(t) for t in dataset.ids], input_len, r + seed)


def build_passes(workload: Workload, vocab_size: int, special_ids: Iterable[int] = (),
                 dataset: DatasetPrompts | None = None, prefix: str = "") -> list[WorkloadPass]:
    """One `WorkloadPass` per cell of the row's matrix, in `Workload.cells()` order.

    Request `r` of a cell gets seed `seeds[r % len(seeds)]`; its prompt depends
    on the input length, the request index and that seed (not on the
    concurrency), so cells of equal input length send the same prompts: random
    ids, or with `dataset` the prompt file's text `(r + seed) mod n` cut or filled
    to the input length. `prefix` (a model id and `/`) starts every cell name.
    """
    if not workload.seeds:
        raise WorkloadError("workload.seeds: at least one seed is required")
    allowed = allowed_ids(vocab_size, special_ids)
    s = workload.sampling
    passes = []
    for input_len in workload.input_lens:
        for concurrency in workload.concurrency:
            cell = f"{prefix}i{input_len}-c{concurrency}"
            requests = tuple(
                Request(id=f"{cell}-r{r}", cell=cell,
                        prompt_ids=_prompt(input_len, r, seed, allowed, dataset),
                        max_tokens=workload.output_len, seed=seed)
                for r in range(workload.requests_per_cell)
                for seed in [workload.seeds[r % len(workload.seeds)]])
            passes.append(WorkloadPass(
                cell=cell, concurrency=concurrency, requests=requests,
                temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
                ignore_eos=s.ignore_eos, prefix_caching=workload.prefix_caching,
                dataset=dataset.describe if dataset else ()))
    return passes


def _canonical_pass(p: WorkloadPass) -> dict[str, Any]:
    doc = asdict(p)
    if not doc["dataset"]:
        # Random-id passes keep the form they had before datasets: their digests (and
        # the signed oracle records that name them) stay valid.
        del doc["dataset"]
    else:
        doc["dataset"] = dict(doc["dataset"])
    return doc


def canonical(passes: Sequence[WorkloadPass]) -> bytes:
    """The canonical JSON bytes the digest is taken over (with a dataset: its sha256,
    format and selection)."""
    doc = {"version": DIGEST_VERSION, "passes": [_canonical_pass(p) for p in passes]}
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def workload_digest(passes: Sequence[WorkloadPass]) -> str:
    """`sha256:<hex>` of the canonical workload; equal on both arms or no comparison."""
    return "sha256:" + hashlib.sha256(canonical(passes)).hexdigest()


def check_same_workload(oracle_digest: str, candidate_digest: str, oracle_source: str = "") -> None:
    """Raise `WorkloadMismatch` unless both arms recorded the same workload digest."""
    if oracle_digest != candidate_digest:
        source = f" ({oracle_source})" if oracle_source else ""
        raise WorkloadMismatch(f"workload digest differs across arms: oracle {oracle_digest}"
                               f"{source}, candidate {candidate_digest}")


class WorkloadMismatch(Error):
    """Two arms ran different workloads: the comparison is an ERROR, not a FAIL."""
