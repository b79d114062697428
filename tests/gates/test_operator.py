"""Operator gate on the CPU: the logic that decides PASS/FAIL, exercised on real
data from the fp64 reference (the kernels themselves run in test_operator_gpu)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rowgate import gates
from rowgate.gates.operator import Operator, derive_records
from rowgate.ops import cases as grid
from rowgate.ops import paged_inputs as pi
from rowgate.ops.reference import decode_attention_fp64
from rowgate.records.status import Status
from rowgate.rows.row import resolve_row


def _spec(**kw):
    base = dict(seeds=[0], kv_dtypes=["e5m2"], heads=[[8, 1]], head_dims=[64], page_sizes=[16],
                layouts=["uniform", "ragged"], batches=[1, 4], contexts=["1", "page+1"],
                tolerance=SimpleNamespace(rtol=0.02, atol=0.02), timing_repeats=9)
    return SimpleNamespace(**{**base, **kw})


def _record(case: grid.Case, spec, perturb: int | None = None) -> dict:
    """A gate record whose two 'variants' are the fp64 reference rounded to bf16
    (optionally one element changed in the candidate): real data, real comparators."""
    inp = pi.make_inputs(case)
    ref = decode_attention_fp64(inp.q, inp.k_cache, inp.v_cache, inp.block_table, inp.seq_lens,
                                k_scale=inp.k_scale, v_scale=inp.v_scale)
    outs = {}
    for role in ("baseline", "candidate"):
        out = pi.poisoned_output(inp.q)
        out.copy_(ref.to(torch.bfloat16))
        if role == "candidate" and perturb is not None:
            out.view(-1)[perturb] = out.view(-1)[perturb] * 2 + 1
        outs[role] = out
    variants = {}
    for role, out in outs.items():
        rec = pi.against_reference(out, ref, spec.tolerance.rtol, spec.tolerance.atol)
        rec["unwritten"] = pi.unwritten(out)
        variants[role] = rec
    return {"case": case.as_dict(), "order": ["baseline", "candidate"], "variants": variants,
            "bitwise": pi.bitwise(outs["baseline"], outs["candidate"])}


def test_operator_kind_is_registered():
    assert gates.registry.lookup("operator") is Operator
    assert "operator" in gates.device_kinds()


def test_context_labels():
    assert [grid.context_tokens(x, 64) for x in ("1", "page-1", "page", "page+1", "1024")] == [
        1, 63, 64, 65, 1024]
    assert grid.context_tokens("17.8K", 16) == 18227  # K = 1024, rounded


def test_ragged_lengths_are_seeded_and_bounded():
    a = grid.seq_lengths("ragged", 1000, 16, seed=0)
    assert a == grid.seq_lengths("ragged", 1000, 16, seed=0)
    assert a != grid.seq_lengths("ragged", 1000, 16, seed=1)
    assert max(a) == 1000 and min(a) >= 1 and len(set(a)) > 1
    assert grid.seq_lengths("uniform", 1000, 4, seed=0) == [1000] * 4


def test_cases_of_the_sm70_row_cover_its_matrix():
    spec = resolve_row("SM70-XQA-E5M2-DECODE").row.gate("operator")
    cases = grid.cases(spec)
    assert len(cases) == 896  # 4 batches x 2 layouts x 7 contexts x 2 pages x 2 heads x 2 dims x 2 seeds
    assert {c.context for c in cases} == set(spec.contexts)
    assert all(max(c.lens) == grid.context_tokens(c.context, c.page) for c in cases)
    # ragged B1 is uniform by definition and not repeated
    assert not [c for c in grid.cases(_spec()) if c.batch == 1 and c.layout == "ragged"]


def test_grid_values_that_make_no_case_are_named():
    """A ragged layout needs two sequences: batch 1 of a ragged-only grid makes nothing,
    and neither does a ragged layout in a grid of batch 1 only; a full grid names nothing."""
    ragged_only = _spec(batches=[1, 4], layouts=["ragged"])
    assert grid.unused(ragged_only) == ["batch 1"]
    assert all(c.batch == 4 for c in grid.cases(ragged_only))
    ones = _spec(batches=[1])
    assert grid.unused(ones) == ["layout ragged"]
    assert grid.unused(_spec()) == []


def test_pages_are_shuffled_and_everything_unowned_is_poison():
    case = grid.Case(3, 4, "ragged", "page+1", 16, "e5m2", 8, 1, 64,
                   grid.seq_lengths("ragged", 40, 4, 3))
    inp = pi.make_inputs(case)
    page = case.page
    owned = []
    for b, length in enumerate(case.lens):
        n = -(-length // page)
        owned += inp.block_table[b, :n].tolist()
        pad = inp.block_table[b, n:]
        assert (inp.k_cache[pad.long()] == pi.POISON_E5M2).all()  # padding -> poison page
        tail = length - (n - 1) * page
        last = int(inp.block_table[b, n - 1])
        assert (inp.k_cache[last, :, tail:] == pi.POISON_E5M2).all()
        assert (inp.v_cache[last, :, tail:] == pi.POISON_E5M2).all()
    assert len(owned) == len(set(owned)) == inp.used_pages
    assert owned != sorted(owned)  # physical order is shuffled
    unowned = sorted(set(range(inp.k_cache.shape[0])) - set(owned))
    assert len(unowned) == inp.poison_pages >= 2
    assert (inp.k_cache[unowned] == pi.POISON_E5M2).all()
    assert (inp.v_cache[unowned] == pi.POISON_E5M2).all()


def test_reference_reads_only_owned_rows():
    """Poison is NaN: a reference that touched it would not be finite; and
    replacing the poison by other values leaves the result unchanged."""
    case = grid.Case(1, 4, "ragged", "page-1", 16, "bf16", 32, 8, 128,
                   grid.seq_lengths("ragged", 15, 4, 1))
    inp = pi.make_inputs(case)
    ref = decode_attention_fp64(inp.q, inp.k_cache, inp.v_cache, inp.block_table, inp.seq_lens,
                                k_scale=inp.k_scale, v_scale=inp.v_scale)
    assert torch.isfinite(ref).all()
    k = inp.k_cache.clone()
    k[torch.isnan(k)] = 3.0
    again = decode_attention_fp64(inp.q, k, inp.v_cache, inp.block_table, inp.seq_lens,
                                  k_scale=inp.k_scale, v_scale=inp.v_scale)
    assert torch.equal(ref, again)


def test_bitwise_comparator_reports_first_mismatch_and_both_values():
    x = torch.randn(2, 8, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    y = x.clone()
    assert pi.bitwise(x, y)["mismatches"] == 0
    y.view(-1)[300] = -y.view(-1)[300]
    y.view(-1)[700] = 0.5
    rec = pi.bitwise(x, y)
    assert rec["mismatches"] == 2 and rec["first_index"] == 300
    assert float(rec["a"]["value"]) == -float(rec["b"]["value"])
    zero, negzero = torch.zeros(1, dtype=torch.bfloat16), -torch.zeros(1, dtype=torch.bfloat16)
    assert pi.bitwise(zero, negzero)["mismatches"] == 1  # bits, not values


def test_nan_never_passes_and_poison_is_counted():
    ref = torch.linspace(-1, 1, 64, dtype=torch.float64)
    out = ref.to(torch.bfloat16)
    assert pi.against_reference(out, ref, 0.02, 0.02)["failures"] == 0
    out[5] = float("nan")
    rec = pi.against_reference(out, ref, 0.02, 0.02)
    assert rec["failures"] == 1 and rec["nan"] == 1 and rec["first_index"] == 5
    buf = pi.poisoned_output(torch.empty(4, 8, dtype=torch.bfloat16))
    assert pi.unwritten(buf) == 32
    buf[:2] = 1.0
    assert pi.unwritten(buf) == 16
    assert pi.against_reference(buf, torch.ones(32, dtype=torch.float64), 0.1, 0.1)["nan"] == 16


def test_derive_passes_equal_variants_and_names_the_first_mismatch(tmp_path):
    spec = _spec()
    cases = grid.cases(spec)
    good = [_record(c, spec) for c in cases]
    derived = derive_records(good, {"shapes": {}})
    assert derived.status is Status.PASS, derived.reason
    assert derived.metrics["cases"] == len(cases) and derived.metrics["bitwise_mismatches"] == 0

    bad = good[:2] + [_record(cases[2], spec, perturb=7)] + good[3:]
    derived = derive_records(bad, {"shapes": {}})
    assert derived.status is Status.FAIL
    assert derived.metrics["bitwise_mismatches"] == 1
    assert cases[2].name in derived.reason and "element 7" in derived.reason

    # no metric hides NaN: one NaN output and the error is NaN, whatever the rest measured
    nan = [_record(cases[0], spec)] + good[1:]
    nan[0]["variants"]["candidate"]["nan"] = 3
    with_nan = derive_records(nan, {"shapes": {}})
    assert with_nan.status is Status.FAIL and with_nan.metrics["nan_outputs"] == 3
    assert with_nan.metrics["max_abs_err"] == "NaN (3 non-finite outputs)"

    # derive is pure over the artifacts: the gate reads back what measure writes
    gate_dir = _bundle_layout(tmp_path)
    (gate_dir / "cases.json").write_text(json.dumps(bad))
    (gate_dir / "timing.json").write_text(json.dumps(
        {"shapes": {"B1x1024": {"samples_us": {"baseline": [5.0, 6.0, 7.0],
                                               "candidate": [4.0, 5.0, 6.0]}}}}))
    row = resolve_row("SM70-XQA-E5M2-DECODE").row
    again = Operator().derive(row, row.gate("operator"), gate_dir)
    assert again.status is Status.FAIL and again.reason == derived.reason
    assert again.metrics["time_ratio_B1x1024"] == pytest.approx(5.0 / 6.0, rel=1e-3)


def _bundle_layout(root: Path) -> Path:
    """artifacts/operator/ beside artifacts/build/ holding the cubin its cubin.json names."""
    import hashlib

    cubin = root / "artifacts" / "build" / "sm_90" / "k" / "k.sm_90.cubin"
    cubin.parent.mkdir(parents=True)
    cubin.write_bytes(b"\x7fELF a stand-in for the build's cubin")
    digest = hashlib.sha256(cubin.read_bytes()).hexdigest()
    gate_dir = root / "artifacts" / "operator"
    gate_dir.mkdir()
    (gate_dir / "cubin.json").write_text(json.dumps({
        "build_gate": "build", "kernel": "k", "arch": "sm_90",
        "cubin": "build/sm_90/k/k.sm_90.cubin", "sha256_recorded": digest,
        "sha256_used": digest}))
    return gate_dir


def test_case_records_are_sealed_gzipped_and_derive_reads_them(tmp_path):
    """write_records seals cases.json.gz / cases.csv.gz byte-stable; derive reads the .gz
    (a mismatch planted in the records is found through it)."""
    import gzip

    from rowgate.ops import operator_ab

    spec = _spec()
    cases = grid.cases(spec)
    records = [_record(c, spec) for c in cases[:3]] + [_record(cases[3], spec, perturb=2)]
    gate_dir = _bundle_layout(tmp_path)
    operator_ab.write_records(gate_dir, records, {"shapes": {}})
    assert not (gate_dir / "cases.json").exists() and not (gate_dir / "cases.csv").exists()
    packed = (gate_dir / "cases.json.gz").read_bytes()
    assert packed[:2] == b"\x1f\x8b" and packed[4:8] == b"\0\0\0\0"  # mtime 0
    assert json.loads(gzip.decompress(packed)) == json.loads(json.dumps(records))
    table = gzip.decompress((gate_dir / "cases.csv.gz").read_bytes()).decode()
    assert table.startswith("case,variant,") and cases[3].name in table
    row = resolve_row("SM70-XQA-E5M2-DECODE").row
    derived = Operator().derive(row, row.gate("operator"), gate_dir)
    assert derived.status is Status.FAIL and derived.metrics["cases"] == 4
    assert cases[3].name in derived.reason and "element 2" in derived.reason


def test_the_cubin_measured_is_the_one_built(tmp_path):
    """derive re-hashes the build gate's cubin where the bundle holds it."""
    spec = _spec()
    records = [_record(c, spec) for c in grid.cases(spec)[:2]]
    gate_dir = _bundle_layout(tmp_path)
    (gate_dir / "cases.json").write_text(json.dumps(records))
    (gate_dir / "timing.json").write_text(json.dumps({"shapes": {}}))
    row = resolve_row("SM70-XQA-E5M2-DECODE").row
    assert Operator().derive(row, row.gate("operator"), gate_dir).status is Status.PASS
    (tmp_path / "artifacts" / "build" / "sm_90" / "k" / "k.sm_90.cubin").write_bytes(b"other")
    derived = Operator().derive(row, row.gate("operator"), gate_dir)
    assert derived.status is Status.FAIL
    assert derived.reason.startswith("cubin build/sm_90/k/k.sm_90.cubin: sha256 ")


@pytest.mark.parametrize("field,count", [("guard_writes", 3), ("counters_nonzero", 1)])
def test_writes_outside_the_output_and_counters_left_set_fail(field, count):
    spec = _spec()
    records = [_record(c, spec) for c in grid.cases(spec)[:3]]
    for r in records:
        for v in r["variants"].values():
            v.update(guard_writes=0, counters_nonzero=0)
    records[1]["variants"]["candidate"][field] = count
    derived = derive_records(records, {"shapes": {}})
    assert derived.status is Status.FAIL
    assert f"first {records[1]['case']['name']} candidate" in derived.reason
    assert derived.metrics["guard_writes" if field == "guard_writes" else "counters_left_set"] \
        == count


def test_operator_is_pending_without_a_cuda_device(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this host has a CUDA device")
    row = resolve_row("SM70-XQA-E5M2-DECODE").row
    why = Operator().requirements(row, row.gate("operator"), None)
    assert why and "CUDA" in why
