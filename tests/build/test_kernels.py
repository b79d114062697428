"""kernels/kernels.toml: the real file loads; bad ones fail with one line naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from rowgate.cuda import kernels
from rowgate.errors import SubjectError
from tests.support import LAB

REPO = Path(__file__).resolve().parents[2]


def test_repository_kernels_toml_loads():
    manifest = kernels.load(LAB)
    da = manifest.kernels["decode_attention"]
    assert {"sm_70", "sm_90", "sm_110"} <= set(da.arches)
    assert da.budget("sm_110").max_spill_stores == 0
    # the SM70 row's kernels: the simple one and the split-KV baseline/candidate
    assert manifest.select([], "sm_70") == ["decode_attention", "split_kv"]
    assert manifest.kernels["split_kv"].budget("sm_70").max_registers == 255
    assert manifest.kernels["split_kv"].budget("sm_90").max_registers == 128


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
    manifest = kernels.load(LAB)
    with pytest.raises(kernels.KernelsError, match="not in kernels.toml"):
        manifest.select(["nope"], "sm_90")
    with pytest.raises(kernels.KernelsError, match="does not target sm_80"):
        manifest.select(["decode_attention"], "sm_80")


KERNEL = '[kernels.k]\nsource = "k.cu"\nentry_points = ["k_bf16_64_1_b", "k_bf16_64_1_c"]\n' \
         'arches = ["sm_90"]\n'
OPERATOR = '[operators.op]\ncontract = "paged-decode-attention/1"\nkernel = "k"\n' \
           'baseline = "k_{kv_dtype}_{head_dim}_{group}_b"\n' \
           'candidates = ["k_{kv_dtype}_{head_dim}_{group}_c"]\nkv_dtypes = ["bf16"]\n' \
           'head_dims = [64]\ngroups = [1]\npage_sizes = [16]\n'


def test_version_2_declares_operators_and_version_1_is_still_read():
    m = kernels.parse("version = 2\n" + KERNEL + OPERATOR, "t.toml")
    assert m.operator() == ("op", m.operators["op"])
    assert kernels.parse("version = 1\n" + KERNEL, "t.toml").operators == {}
    assert kernels.load(LAB).operator("split_kv")[1].kernel == "split_kv"


@pytest.mark.parametrize("text,message", [
    ("version = 1\n" + KERNEL + OPERATOR, "t.toml: operators/triton tables need version = 2"),
    ("version = 2\n" + KERNEL + OPERATOR.replace("groups = [1]", "groups = [1, 2]"),
     "t.toml: operators.op: entry point(s) k_bf16_64_2_b, k_bf16_64_2_c not in "
     "kernels.k.entry_points"),
    ("version = 2\n" + KERNEL.replace("[kernels.k]", '[kernels."../k"]'),
     "t.toml: kernels.../k: not a valid kernel name"),
    ("version = 2\n" + KERNEL + OPERATOR.replace("[operators.op]", '[operators."a/b"]'),
     "t.toml: operators.a/b: String should match pattern"),
    ("version = 3\n" + KERNEL, "t.toml: version: Input should be 1 or 2"),
])
def test_bad_version_2_tables_are_one_clear_line(text, message):
    # a kernel's name becomes a directory: the confinement rule refuses it first (a
    # SubjectError, KernelsError's base), before the tables' own validation
    with pytest.raises(SubjectError) as err:
        kernels.parse(text, "t.toml")
    assert err.value.diagnostics().startswith(message), err.value.diagnostics()


def _subject(tmp_path: Path, text: str) -> Path:
    (tmp_path / "kernels").mkdir(parents=True)
    (tmp_path / "kernels" / "kernels.toml").write_text(text)
    return tmp_path


def test_paths_a_subject_names_stay_inside_it(tmp_path):
    """load() refuses what leaves the subject with a SubjectError (KernelsError's base,
    as its docstring says), one line naming the file and key."""
    outside = tmp_path / "outside.cu"
    outside.write_text("// not the subject's\n")
    repo = _subject(tmp_path / "s", "version = 2\n" + KERNEL)
    (repo / "kernels" / "k.cu").symlink_to(outside)
    with pytest.raises(SubjectError, match=r"kernels.k.source: 'k.cu' resolves outside "
                                                   r"the subject"):
        kernels.load(repo)
    (repo / "kernels" / "k.cu").unlink()
    (repo / "kernels" / "k.cu").mkdir()
    with pytest.raises(SubjectError, match="kernels.k.source: 'k.cu' is a directory, not a regular file"):
        kernels.load(repo)
    escaping = _subject(tmp_path / "t", "")
    (escaping / "kernels" / "kernels.toml").unlink()
    (escaping / "kernels" / "kernels.toml").symlink_to(repo / "kernels" / "kernels.toml")
    with pytest.raises(SubjectError, match="kernels.toml: 'kernels/kernels.toml' resolves outside"):
        kernels.load(escaping)
    triton = _subject(tmp_path / "u", "version = 2\n" + KERNEL + '[triton.t]\nsource = "../../x.py"\n'
                      'function = "f"\nsignature = { x = "*fp32" }\n')
    (triton / "kernels" / "k.cu").write_text("")
    with pytest.raises(SubjectError, match=r"triton.t.source: '../../x.py' resolves outside"):
        kernels.load(triton)
