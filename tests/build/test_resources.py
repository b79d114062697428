"""ptxas report / cuobjdump parsers and budget checks, on real captured tool output
(tests/fixtures/ptxas/: CUDA 12.8.93 ptxas, CUDA 13.5.37 nvcc, cuobjdump 12.8.55/13.5.37)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rowgate.cuda import kernels, resources

FIXTURES = Path(__file__).parents[1] / "fixtures" / "ptxas"
ENTRIES = ["decode_attention_bf16_hd64", "decode_attention_bf16_hd128",
           "decode_attention_e5m2_hd64", "decode_attention_e5m2_hd128"]


def _text(name: str) -> str:
    return (FIXTURES / name).read_text()


def _kernel(budget: str = "", sass: str = "") -> kernels.Kernel:
    text = f'''
        version = 1
        [kernels.k]
        source = "k.cu"
        entry_points = ["scale"]
        arches = ["sm_70", "sm_90"]
        [kernels.k.budgets.all]
        {budget}
        {sass}
    '''
    return kernels.parse(text.replace("\n        ", "\n"), "test.toml").kernels["k"]


def test_parse_standalone_ptxas_sm70():
    report = resources.parse_ptxas(_text("decode_attention.sm_70.ptxas.log"))
    assert sorted(report) == sorted(ENTRIES)
    fn = report["decode_attention_e5m2_hd128"]
    assert (fn.arch, fn.registers, fn.stack_frame, fn.spill_stores, fn.spill_loads) == \
        ("sm_70", 35, 0, 0, 0)
    assert (fn.shared, fn.barriers, fn.cmem) == (2080, 1, {0: 428, 2: 8})


def test_parse_nvcc_driven_ptxas_sm110():
    report = resources.parse_ptxas(_text("decode_attention.sm_110.nvcc.log"))
    assert sorted(report) == sorted(ENTRIES)
    assert {fn.arch for fn in report.values()} == {"sm_110"}
    assert report["decode_attention_bf16_hd64"].shared == 1056
    assert all(fn.registers and fn.registers <= 48 for fn in report.values())


def test_parse_spilling_report():
    fn = resources.parse_ptxas(_text("spill.sm_90.no-werror.nvcc.log"))["spill"]
    assert (fn.registers, fn.stack_frame, fn.spill_stores, fn.spill_loads) == (32, 1128, 1948, 2408)


def test_diagnostics_skip_the_report_but_keep_errors():
    assert resources.diagnostics(_text("decode_attention.sm_110.nvcc.log"), "nvcc") == []
    diags = resources.diagnostics(_text("spill.sm_90.nvcc.log"), "nvcc")
    assert len(diags) == 2 and all(d.startswith("ptxas error") for d in diags)
    assert "1948 bytes spill stores" in diags[1]


def test_nvrtc_sm70_notice_is_the_one_ignored_line():
    notice = resources.NVRTC_SM70_NOTICE + "\n\n"
    assert resources.diagnostics(notice, "nvrtc") == []
    # Only NVRTC's own log gets the exception, and only for that exact line.
    assert resources.diagnostics(notice, "ptxas") == [resources.NVRTC_SM70_NOTICE]
    warn = notice + 'k.cu(3): warning #177-D: variable "x" was declared but never referenced\n'
    assert resources.diagnostics(warn, "nvrtc") == [warn.splitlines()[2]]


def test_parse_resource_usage():
    usage = resources.parse_resource_usage(_text("decode_attention.sm_90.resource-usage.txt"))
    assert sorted(usage) == sorted(ENTRIES)
    assert usage["decode_attention_e5m2_hd128"] == {
        "REG": 37, "STACK": 0, "SHARED": 3104, "LOCAL": 0, "CONSTANT[0]": 604, "TEXTURE": 0,
        "SURFACE": 0, "SAMPLER": 0}


def test_parse_sass_skips_never_executed_instructions():
    sass = resources.parse_sass(_text("clean.sm_70.sass.txt"))
    assert sass.arches == ["sm_70"]
    ops = sass.opcodes["scale"]
    # sm_70 code opens with `@!PT SHFL.IDX`, which never runs: not a shuffle.
    assert "SHFL" not in ops
    assert ops["EXIT"] >= 1 and ops["LDG"] == 1 and ops["STG"] == 1


def test_parse_sass_sm90():
    sass = resources.parse_sass(_text("clean.sm_90.sass.txt"))
    assert sass.arches == ["sm_90"]
    assert sass.opcodes["scale"]["FMUL"] == 1


def test_register_budget_names_both_numbers():
    fn = resources.parse_ptxas(_text("decode_attention.sm_70.ptxas.log"))["decode_attention_bf16_hd64"]
    budget = _kernel("max_registers = 24").budget("sm_70")
    [v] = resources.check_budget("k", fn.name, "sm_70", budget, fn, None)
    assert str(v) == "k/decode_attention_bf16_hd64 sm_70: registers 36 exceeds budget 24"


def test_spills_and_stack_break_default_zero_budgets():
    fn = resources.parse_ptxas(_text("spill.sm_90.no-werror.nvcc.log"))["spill"]
    found = {v.what: (v.measured, v.budget)
             for v in resources.check_budget("k", "spill", "sm_90", _kernel().budget("sm_90"), fn, None)}
    assert found == {"spill stores (bytes)": (1948, 0), "spill loads (bytes)": (2408, 0),
                     "stack frame (bytes)": (1128, 0)}


def test_within_budget_is_clean_and_missing_entry_is_a_violation():
    report = resources.parse_ptxas(_text("decode_attention.sm_70.ptxas.log"))
    usage = resources.parse_resource_usage(_text("decode_attention.sm_90.resource-usage.txt"))
    budget = _kernel("max_registers = 48\nmax_static_shared_bytes = 2080").budget("sm_70")
    for ep in ENTRIES:
        assert resources.check_budget("k", ep, "sm_70", budget, report[ep], usage[ep]) == []
    [v] = resources.check_budget("k", "absent", "sm_70", budget, None, None)
    assert "entry point missing" in str(v)


@pytest.mark.parametrize("rule,expected", [
    ('forbid = ["STG"]', "SASS forbids STG"),
    ('require = ["HMMA"]', "SASS requires HMMA"),
])
def test_sass_rules(rule, expected):
    kernel = _kernel(sass=f"[[kernels.k.sass]]\n{rule}")
    ops = resources.parse_sass(_text("clean.sm_90.sass.txt")).opcodes["scale"]
    [v] = resources.check_sass("k", kernel, "scale", "sm_90", ops)
    assert v.what == expected


def test_sass_rule_scoped_to_other_arch_does_not_apply():
    kernel = _kernel(sass='[[kernels.k.sass]]\narches = ["sm_70"]\nrequire = ["HMMA"]')
    ops = resources.parse_sass(_text("clean.sm_90.sass.txt")).opcodes["scale"]
    assert resources.check_sass("k", kernel, "scale", "sm_90", ops) == []
