"""kernels.toml version 2 declarations: the external fixture's operator and Triton
tables, refusals with one line, and docs/contracts.md kept true to the code."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from pydantic import ValidationError

from rowgate.cuda.operators import OperatorDecl, TritonDecl, check_operators
from rowgate.ops import contract
from tests.subjects import PAGED_DECODE
from tests.support import LAB

ROOT = Path(__file__).resolve().parents[2]
FIXTURE_TOML = tomllib.loads((PAGED_DECODE / "kernels" / "kernels.toml").read_text())


def _decl(**changes) -> dict:
    return {**FIXTURE_TOML["operators"]["pm_paged_decode"], **changes}


def test_the_fixtures_operator_declares_every_entry_point_it_names():
    decl = OperatorDecl.model_validate(_decl())
    op = decl.to_contract("pm_paged_decode")
    assert op.entries("e5m2", 128, 4) == {"baseline": "pm_decode_e5m2_h128_g4_ref",
                                          "candidate": "pm_decode_e5m2_h128_g4_pf"}
    assert len(op.all_entries()) == 32 and not op.split_kv and op.threads == 128
    kernels = {k: v["entry_points"] for k, v in FIXTURE_TOML["kernels"].items()}
    assert check_operators({"pm_paged_decode": decl}, kernels) == []
    assert set(decl.phases) == {"v_load", "qk"} and decl.phases["qk"].effect == "doubles"
    # the parser and the bare-image reader agree
    assert contract.operators_in((PAGED_DECODE / "kernels" / "kernels.toml").read_text(),
                                 "kernels.toml") == {"pm_paged_decode": op}


def test_an_entry_point_the_kernel_lacks_is_named():
    decl = OperatorDecl.model_validate(_decl(groups=[1, 2, 4, 8, 16]))
    kernels = {k: v["entry_points"] for k, v in FIXTURE_TOML["kernels"].items()}
    [problem] = check_operators({"pm_paged_decode": decl}, kernels)
    assert problem.startswith("operators.pm_paged_decode: entry point(s) "
                              "pm_decode_bf16_h64_g16_ref, pm_decode_bf16_h64_g16_pf, "
                              "pm_decode_bf16_h128_g16_ref (+5 more) not in "
                              "kernels.pm_decode.entry_points")
    [problem] = check_operators({"x": OperatorDecl.model_validate(_decl(kernel="nope"))}, kernels)
    assert problem == "operators.x.kernel: 'nope' is not a [kernels.*] table (known: pm_decode)"


@pytest.mark.parametrize("changes,message", [
    ({"baseline": "pm_{kv}_{head_dim}"}, "unknown placeholder(s) kv"),
    ({"head_dims": [64, 100]}, "head_dims: expected multiples of 16"),
    ({"contract": "paged-decode-attention/2"}, "this rowgate implements"),
    ({"kernel": "../escape"}, "String should match pattern"),
    ({"shared_memory": [{"entry_points": ["*"], "chunk_heads": -4}]}, "greater than or equal to 0"),
    ({"phases": {"qk": {"defines": ["PM_PHASE=2"], "effect": "halves"}}}, "'removes' or 'doubles'"),
    ({"phases": {"qk": {"defines": ["X; rm -rf /"], "effect": "removes"}}}, "String should match"),
    ({"colour": "red"}, "Extra inputs are not permitted"),
    ({"groups_by_kv_dtype": {"fp8": [2]}}, "Input should be 'bf16' or 'e5m2'"),
    ({"launch": [{"cluster_entry": "{name}c", "cluster_splits": 8}]},
     "launch.cluster_entry '{name}c': expected the placeholder {entry} and no other"),
    ({"launch": [{"cluster_entry": "{entry}c", "cluster_splits": 12}]},
     "launch.cluster_splits: expected 0..8 (a portable cluster), got 12"),
    ({"contract": "harness/1", "harness": "tools/h.py:run"},
     "contract harness/1: baseline, candidates, phases belong to the fixed contract"),
    ({"contract": "harness/1", "harness": "tools/h.py", "baseline": "", "candidates": [],
      "phases": {}}, "harness\n  String should match pattern"),
])
def test_declarations_outside_the_format_are_refused(changes, message):
    with pytest.raises(ValidationError, match=re.escape(message)):
        OperatorDecl.model_validate(_decl(**changes))


def test_rowgates_own_operators_parse_alike_and_name_what_their_kernels_build():
    """The validating parser and the bare-image reader agree on rowgate's kernels.toml;
    the sm_90+ candidates' cluster entry points (split_kv_bulk, split_kv_deep) are entry
    points of their kernels, which split_kv (built for sm_70 too) does not list."""
    from rowgate.cuda import kernels

    manifest = kernels.load(LAB)
    own = contract.operators_in((LAB / "kernels" / "kernels.toml").read_text(), "kernels.toml")
    assert {n: d.to_contract(n) for n, d in manifest.operators.items()} == own
    assert set(own) == {"split_kv", "split_kv_bulk", "split_kv_deep"}
    assert "sm_70" in manifest.kernels["split_kv"].arches
    for name, suffix in (("split_kv_bulk", "bulk"), ("split_kv_deep", "deep")):
        unit = manifest.kernels[name]
        assert own[name].kernel == name
        assert set(own[name].all_entries()) == set(unit.entry_points)
        assert unit.arches == ["sm_90", "sm_110"]
        assert not any(suffix in e for e in manifest.kernels["split_kv"].entry_points)


def test_the_fixtures_triton_kernel_and_its_constants():
    decl = TritonDecl.model_validate(FIXTURE_TOML["triton"]["pm_rms_norm"])
    assert decl.function == "pm_rms_norm" and decl.constants == {"BLOCK": 1024}
    bad = {**FIXTURE_TOML["triton"]["pm_rms_norm"], "constants": {}}
    with pytest.raises(ValidationError, match=r"constants: expected a value for each constexpr "
                                              r"parameter \(BLOCK\), got none"):
        TritonDecl.model_validate(bad)


def test_the_contract_doc_lists_the_parameters_in_order():
    text = (ROOT / "docs" / "contracts.md").read_text()
    section = text.split("### Kernel parameters", 1)[1].split("###", 1)[0]
    rows = re.findall(r"^\| (\d+) \| `(\w+)` \| `([^`]+)` \|", section, re.MULTILINE)
    assert [int(n) for n, _, _ in rows] == list(range(len(contract.PARAMETERS)))
    assert [name for _, name, _ in rows] == [p.name for p in contract.PARAMETERS]
    kinds = {"int32_t": "int32", "float": "float32"}
    assert [kinds.get(t, "pointer" if t.endswith("*") else t) for _, _, t in rows] == [
        p.kind for p in contract.PARAMETERS]


def test_the_contract_docs_example_table_is_a_valid_declaration():
    text = (ROOT / "docs" / "contracts.md").read_text()
    block = text.split("## kernels.toml format version 2", 1)[1].split("```toml\n", 1)[1]
    block = block.split("```", 1)[0]
    data = tomllib.loads(block.replace('"xqa_e5m2_pipe_d64_g4", …', '"xqa_e5m2_pipe_d64_g4"'))
    decl = OperatorDecl.model_validate(data["operators"]["xqa_decode"])
    assert decl.to_contract("xqa_decode").smem("xqa_e5m2_pipe_d128_g4", 512, 4, 128) == \
        512 * 4 * 4 + 256 * 128
    TritonDecl.model_validate(data["triton"]["rms_norm"])
