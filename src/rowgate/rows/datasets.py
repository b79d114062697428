"""Real prompts for the workload: a local, pinned prompt file tokenized for the model.

A row names its prompt file in `[workload.dataset]`:

    [workload.dataset]
    path = "data/sharegpt-tiny.jsonl"   # relative to the row file
    sha256 = "7495601d…"                # the file must have exactly these bytes
    format = "sharegpt"                 # or "speed-bench"
    category = ""                       # SPEED-Bench: keep only this category

Formats (JSON Lines, one record a line):

* `sharegpt`: `{"conversations": [{"from": "human", "value": TEXT}, …]}` — the
  first human turn is the prompt;
* `speed-bench`: SPEED-Bench's records, `{"turns": [TEXT, …], "category": …}` —
  the first turn is the prompt; `category` (e.g. `low_entropy`) selects records.

Prompts are tokenized with the model's own `tokenizer.json` (no special tokens
added; special / EOS ids dropped, as for random prompts) and made exactly as
long as each cell's input length, deterministically: request `r` starts at
text `(r + seed) mod n`; a text too long is cut, one too short is followed by
the token ids of the texts after it until the length is reached. The file's
sha256 and the selection go into the workload digest (`WorkloadPass.dataset`), so two arms that read different
files, or one file at different bytes, never compare.

Nothing is downloaded: a file that is not on this machine makes the engine
gates PENDING, naming it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rowgate.errors import UsageError

RANDOM = "random-token-ids"
"""The `workload.dataset` string that asks for random token-id prompts."""


class DatasetError(UsageError):
    """A prompt file is missing, altered, malformed, or yields no usable prompt."""


class DatasetRef(BaseModel):
    """`[workload.dataset]` of a row."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: Annotated[str, Field(min_length=1)]
    """The JSONL file, relative to the row file's directory."""
    sha256: Annotated[str, Field(pattern=r"^([0-9a-f]{64})?$")]
    """The file's sha256 (hex); empty only while the file is not on the machine that
    wrote the row: the gates that need it stay PENDING until it is pinned."""
    format: Literal["sharegpt", "speed-bench"]
    category: str = ""
    """SPEED-Bench records of this category only (empty: every record)."""

    def describe(self) -> dict[str, str]:
        """What the workload digest records of the dataset."""
        return {"sha256": self.sha256, "format": self.format, "category": self.category,
                "file": Path(self.path).name}


@dataclass(frozen=True)
class Texts:
    ref: DatasetRef
    path: Path
    texts: tuple[str, ...]


def resolve(ref: DatasetRef, row_dir: Path) -> Path:
    """The file `ref` names, relative to the row's directory."""
    path = Path(ref.path)
    return path if path.is_absolute() else (row_dir / path)


def why_unavailable(ref: DatasetRef, row_dir: Path) -> str | None:
    """PENDING reason when the file is not on this machine (an altered file is an
    error, found when it is read)."""
    path = resolve(ref, row_dir)
    if not path.is_file():
        pin = "" if ref.sha256 else "; the row has not pinned its sha256 yet"
        return f"dataset {ref.path} ({ref.format}) is not on this machine ({path}){pin}"
    return None


def _first_human(record: dict[str, Any]) -> str | None:
    for turn in record.get("conversations") or []:
        if isinstance(turn, dict) and turn.get("from") == "human":
            return str(turn.get("value", ""))
    return None


def _first_turn(record: dict[str, Any], category: str) -> str | None:
    if category and record.get("category") != category:
        return None
    turns = record.get("turns") or []
    return str(turns[0]) if turns else None


def load(ref: DatasetRef, row_dir: Path) -> Texts:
    """The prompt texts of the file, after checking its bytes against the row's pin."""
    path = resolve(ref, row_dir)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DatasetError(f"dataset {path}: cannot read ({exc.strerror})") from exc
    digest = hashlib.sha256(raw).hexdigest()
    if not ref.sha256:
        raise DatasetError(f"dataset {path}: the row pins no sha256 (the file has {digest})")
    if digest != ref.sha256:
        raise DatasetError(f"dataset {path}: sha256 {digest} is not the row's pinned "
                           f"{ref.sha256}")
    pick = _first_human if ref.format == "sharegpt" else \
        (lambda r: _first_turn(r, ref.category))
    texts = []
    for n, line in enumerate(raw.decode("utf-8", errors="strict").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise DatasetError(f"dataset {path}:{n}: not a JSON record") from exc
        text = pick(record) if isinstance(record, dict) else None
        if text:
            texts.append(text)
    if not texts:
        what = f" of category {ref.category!r}" if ref.category else ""
        raise DatasetError(f"dataset {path}: no {ref.format} prompt{what} in the file")
    return Texts(ref, path, tuple(texts))


def tokenize(texts: Texts, tokenizer_json: Path, special_ids: set[int]) -> list[list[int]]:
    """Each text as the model's token ids, special ids removed."""
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(tokenizer_json))
    except Exception as exc:  # tokenizers raises its own Exception subclass
        raise DatasetError(f"{tokenizer_json}: not a tokenizer file") from exc
    ids = [[i for i in enc.ids if i not in special_ids]
           for enc in tok.encode_batch(list(texts.texts), add_special_tokens=False)]
    if not any(ids):
        raise DatasetError(f"dataset {texts.path}: no text gives a token the model's "
                           f"tokenizer knows")
    return ids


def prompt(ids: list[list[int]], length: int, start: int) -> tuple[int, ...]:
    """`length` ids: text `start` cut to length, or filled with the texts after it."""
    out: list[int] = []
    k = start
    while len(out) < length:
        out += ids[k % len(ids)][:length - len(out)]
        k += 1
    return tuple(out)
