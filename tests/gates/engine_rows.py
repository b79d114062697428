"""Helpers for the engine-driven gate tests: rows over the tiny model, a real
gate context, and running one gate of a row the way the runner does."""

from __future__ import annotations

import textwrap
from pathlib import Path

from rowgate.gates.interface import Gate, run_gate
from rowgate.records.gate_result import GateResult
from rowgate.rows.row import load_row
from rowgate.run import provenance, runner
from rowgate.seal import device

ROOT = Path(__file__).resolve().parents[2]


def tiny_row(directory: Path, row_id: str, body: str, *, oracle: str = "vllm",
             input_lens: str = "[16]", concurrency: str = "[1, 4]", output_len: int = 8,
             requests: int = 4, seeds: str = "[0]", candidate_dtype: str = "float32",
             oracle_mode: str = "default") -> Path:
    """A CPU row over the tiny model; `oracle = "reference"` gives a fast A/A."""
    version = "0.32.0" if oracle == "vllm" else "rowgate"
    text = f'''
        id = "{row_id}"
        title = "gate test row"
        kind = "demo"

        [target]
        arch = "cpu"

        [[models]]
        id = "tiny"
        name = "tiny-qwen3"

        [arms.oracle]
        engine = "{oracle}"
        version = "{version}"
        mode = "{oracle_mode}"
        dtype = "float32"

        [arms.candidate]
        engine = "reference"
        mode = "eager"
        dtype = "{candidate_dtype}"

        [workload]
        input_lens = {input_lens}
        concurrency = {concurrency}
        output_len = {output_len}
        requests_per_cell = {requests}
        seeds = {seeds}
    '''
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{row_id}.toml"
    path.write_text(textwrap.dedent(text) + textwrap.dedent(body))
    return path


class Lines:
    """Progress that keeps the lines (a test can see what a gate reported)."""

    def __init__(self):
        self.lines: list[str] = []

    def update(self, message: str) -> None:
        self.lines.append(message)

    def advance(self, total: int | None = None) -> None:
        pass


def run_one(gate: Gate, row_path: Path, gate_id: str, stage: Path,
            options: dict[str, str] | None = None, repo: Path = ROOT) -> GateResult:
    """Run one gate of a row into `stage/artifacts/GATE-ID/`, as the runner does."""
    row = load_row(row_path).row
    devices = device.inventory()
    ctx = runner.gate_context(row, row.gate(gate_id), repo=repo,
                              artifact_dir=stage / "artifacts" / gate_id,
                              subject=provenance.subject(ROOT),
                              provenance=provenance.collect(gpus=list(devices.gpus)),
                              devices=devices, progress=Lines(), options=options)
    return run_gate(gate, row, row.gate(gate_id), ctx, stage)
