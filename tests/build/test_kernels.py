"""kernels/kernels.toml: the real file loads; bad ones fail with one line naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.build import kernels

REPO = Path(__file__).resolve().parents[2]


def test_repository_kernels_toml_loads():
    manifest = kernels.load(REPO)
    da = manifest.kernels["decode_attention"]
    assert {"sm_70", "sm_90", "sm_110"} <= set(da.arches)
    assert da.budget("sm_110").max_spill_stores == 0
    assert manifest.select([], "sm_70") == ["decode_attention"]


def test_arch_override_replaces_only_its_keys():
    m = kernels.parse('''
version = 1
[kernels.k]
source = "k.cu"
entry_points = ["f"]
arches = ["sm_70", "sm_90"]
[kernels.k.budgets.all]
max_registers = 64
max_static_shared_bytes = 1024
[kernels.k.budgets.sm_70]
max_registers = 40
''', "t.toml")
    assert m.kernels["k"].budget("sm_70") == kernels.Budget(max_registers=40,
                                                           max_static_shared_bytes=1024)
    assert m.kernels["k"].budget("sm_90").max_registers == 64


@pytest.mark.parametrize("body,message", [
    ('[kernels.k]\nsource = "k.cu"\nentry_points = ["f"]\narches = ["sm_70"]\nmax_regs = 3',
     "t.toml: kernels.k.max_regs: unknown key"),
    ('[kernels.k]\nsource = "k.cu"\nentry_points = ["f"]\narches = ["sm70"]',
     "t.toml: kernels.k.arches.0: String should match pattern"),
    ('[kernels.k]\nsource = "k.cu"\nentry_points = ["f"]\narches = ["sm_70"]\n'
     '[kernels.k.budgets.sm_90]\nmax_registers = 8', "budgets for sm_90: not in arches"),
])
def test_bad_manifest_is_one_clear_line(body, message):
    with pytest.raises(kernels.KernelsError) as err:
        kernels.parse("version = 1\n" + body, "t.toml")
    assert message in err.value.diagnostics()
    assert "\n" not in err.value.diagnostics()


def test_select_refuses_unknown_or_untargeted_kernel():
    manifest = kernels.load(REPO)
    with pytest.raises(kernels.KernelsError, match="not in kernels.toml"):
        manifest.select(["nope"], "sm_90")
    with pytest.raises(kernels.KernelsError, match="does not target sm_80"):
        manifest.select(["decode_attention"], "sm_80")
