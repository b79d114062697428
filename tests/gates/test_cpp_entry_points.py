"""A project shaped like real CUDA code (tests/fixtures/subjects/templated: a templated
`__global__` kernel its own launcher instantiates, per-kernel nvcc flags) built by the
build gate's recipe for sm_90 and sm_110 with warnings as errors, and audited by
demangled name: the entry points are the template's instantiations, recorded by their
mangled names; a pattern nothing matches names what the build has; the warning policy
cannot be flagged away."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rowgate.cli.progress import PlainProgress
from rowgate.cuda import kernels
from rowgate.gates import audit, build
from rowgate.records.status import Status

pytestmark = pytest.mark.slow

TEMPLATED = Path(__file__).resolve().parents[1] / "fixtures" / "subjects" / "templated"
QUIET = PlainProgress(quiet=True)
ARCHES = ["sm_90", "sm_110"]


def _subject(root: Path, toml_edit: tuple[str, str] | None = None) -> Path:
    shutil.copytree(TEMPLATED, root)
    if toml_edit:
        path = root / "kernels" / "kernels.toml"
        path.write_text(path.read_text().replace(*toml_edit))
    return root


@pytest.fixture(scope="module")
def audited(tmp_path_factory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("templated")
    repo = _subject(tmp / "subject")
    audit.measure_audit(repo, ARCHES, [], {}, tmp / "out", QUIET)
    return repo, tmp / "out"


def test_the_projects_own_instantiations_are_the_entry_points(audited):
    _, out = audited
    assert build.derive_builds(out).status is Status.PASS
    derived = audit.derive_audit(out)
    assert derived.status is Status.PASS, derived.reason
    for arch in ARCHES:
        bf16 = derived.cells[f"gelu/gelu_forward_kernel2<__nv_bfloat16>@{arch}"]
        f32 = derived.cells[f"gelu/gelu_forward_kernel2<float>@{arch}"]
        assert bf16["symbol"] == "_Z20gelu_forward_kernel2I13__nv_bfloat16EvPT_PKS1_i"
        assert f32["symbol"] == "_Z20gelu_forward_kernel2IfEvPT_PKS0_i"
        assert 0 < f32["registers"] <= 64 and f32["sass_instructions"] > 0
    assert derived.metrics["entry_points"] == 4


def test_the_kernels_own_flags_are_on_the_recorded_command_line(audited):
    _, out = audited
    record = next(out.glob("sm_90/gelu/build.json")).read_text()
    assert '"-lineinfo"' in record and '"--use_fast_math"' in record
    assert '"-Wall,-Wextra,-Werror"' in record  # host warnings stay errors by default


def test_a_pattern_nothing_matches_names_what_the_build_has(tmp_path):
    repo = _subject(tmp_path / "subject", ('entry_points = ["gelu_forward_kernel2<*>"]',
                                           'entry_points = ["gelu_forward_kernel3<*>"]'))
    audit.measure_audit(repo, ["sm_90"], [], {}, tmp_path / "out", QUIET)
    derived = audit.derive_audit(tmp_path / "out")
    assert derived.status is Status.FAIL
    assert ("gelu/gelu_forward_kernel3<*> sm_90: entry point: missing: the build has "
            "gelu_forward_kernel2<__nv_bfloat16>, gelu_forward_kernel2<float>") in derived.reason


@pytest.mark.parametrize("flags,said", [
    ('["-w"]', "nvcc_flags: '-w' would silence warnings"),
    ('["--diag-suppress=177"]', "nvcc_flags: '--diag-suppress=177' would silence warnings"),
    ('["-gencode=arch=compute_80,code=sm_80"]', "nvcc_flags: "
     "'-gencode=arch=compute_80,code=sm_80' is set by rowgate's recipe"),
])
def test_flags_cannot_weaken_the_warning_policy(tmp_path, flags, said):
    repo = _subject(tmp_path / "subject", ('nvcc_flags = ["-lineinfo", "--use_fast_math"]',
                                           f"nvcc_flags = {flags}"))
    with pytest.raises(kernels.KernelsError, match="kernels.gelu"):
        kernels.load(repo)
    try:
        kernels.load(repo)
    except kernels.KernelsError as exc:
        assert said in str(exc), str(exc)


def test_host_warnings_off_is_declared_and_recorded(tmp_path):
    repo = _subject(tmp_path / "subject", ('nvcc_flags = ["-lineinfo", "--use_fast_math"]',
                                           'host_warnings = "off"\nhost_flags = ["-O2"]'))
    build.build_into(repo, ["sm_90"], [], {}, tmp_path / "out", QUIET)
    assert build.derive_builds(tmp_path / "out").status is Status.PASS
    record = (tmp_path / "out" / "sm_90" / "gelu" / "build.json").read_text()
    assert '"-Xcompiler",\n        "-O2"' in record and "-Wextra" not in record


# ---------------------------------------------------------------- sm_70: host headers

HOST_HEADERS = ("#include <cuda_bf16.h>\n",
                "#include <cstdio>\n#include <cstdlib>\n#include <cmath>\n#include <cuda_bf16.h>\n")
"""A translation unit that includes libc/libstdc++ headers, as real host code does."""


def _with_host_headers(root: Path) -> Path:
    repo = _subject(root)
    src = repo / "kernels" / "gelu.cu"
    src.write_text(src.read_text().replace(*HOST_HEADERS))
    return repo


def test_a_unit_with_host_headers_builds_for_sm70_with_the_fetched_nvcc(sm70_nvcc, tmp_path):
    repo = _with_host_headers(tmp_path / "subject")
    audit.measure_audit(repo, ["sm_70"], [], {}, tmp_path / "out", QUIET)
    assert build.derive_builds(tmp_path / "out").status is Status.PASS
    derived = audit.derive_audit(tmp_path / "out")
    assert derived.status is Status.PASS, derived.reason
    f32 = derived.cells["gelu/gelu_forward_kernel2<float>@sm_70"]
    assert f32["symbol"] == "_Z20gelu_forward_kernel2IfEvPT_PKS0_i" and f32["registers"] > 0
    argv = json.loads((tmp_path / "out" / "sm_70" / "gelu" / "build.json").read_text())[
        "steps"][0]["argv"]
    assert argv[0] == str(sm70_nvcc) and "arch=compute_70,code=[sm_70,compute_70]" in argv
    assert argv[argv.index("-ccbin") + 1].endswith("/g++-11")
    assert "-Wall,-Wextra,-Werror" in argv  # host code's warnings are errors too


def test_on_nvrtc_a_unit_with_host_headers_fails_saying_which_toolchain_builds_it(tmp_path):
    repo = _with_host_headers(tmp_path / "subject")
    build.build_into(repo, ["sm_70"], [], {"nvcc_sm70": "nvrtc"}, tmp_path / "out", QUIET)
    derived = build.derive_builds(tmp_path / "out")
    assert derived.status is Status.FAIL
    assert 'cannot open source file "cstdio"' in derived.reason, derived.reason
    assert "rowgate toolchain fetch cuda-11.8` or --option nvcc_sm70=PATH" in derived.reason
