"""A project built by its own Makefile (tests/fixtures/subjects/makeproj, shaped like
llm.c's dev/cuda: `$(NVCC) ... -arch=sm_80 -c gelu.cu -o build/gelu.o`): rowgate runs the
Makefile in a private copy with its nvcc wrapper, which builds the arch under gate with
warnings as errors whatever the Makefile says, records every nvcc command line, and the
audit judges the device code extracted from the object by demangled name. No edit to the
project beyond its kernels.toml."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rowgate import compressed
from rowgate.cli.progress import PlainProgress
from rowgate.cuda import toolchains
from rowgate.gates import audit, build
from rowgate.records.status import Status

pytestmark = pytest.mark.slow

SUBJECTS = Path(__file__).resolve().parents[1] / "fixtures" / "subjects"
MAKEPROJ = SUBJECTS / "makeproj"
GELU = SUBJECTS / "templated" / "kernels" / "gelu.cu"
"""The kernel source: the templated fixture's, where this project's layout puts it."""
QUIET = PlainProgress(quiet=True)


def _subject(root: Path, edits: tuple[tuple[str, str, str], ...] = (), *,
             project: Path = MAKEPROJ, gelu_at: str = "dev/cuda/gelu.cu") -> Path:
    """A copy of `project` with the templated gelu.cu where its layout puts it, and
    `edits` ((file, old, new) replacements) made."""
    shutil.copytree(project, root)
    (root / gelu_at).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(GELU, root / gelu_at)
    for rel, old, new in edits:
        path = root / rel
        assert old in path.read_text()
        path.write_text(path.read_text().replace(old, new))
    return root


@pytest.fixture(scope="module")
def audited(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("makeproj")
    subject = _subject(tmp / "subject")
    audit.measure_audit(subject, ["sm_90", "sm_110"], [], {}, tmp / "out", QUIET)
    assert not (subject / "build").exists()  # built in a copy, never in the subject
    return tmp / "out"


def test_the_makefile_builds_every_arch_through_the_wrapper_and_audits(audited):
    assert build.derive_builds(audited).status is Status.PASS
    derived = audit.derive_audit(audited)
    assert derived.status is Status.PASS, derived.reason
    assert "2 build(s) by the project's own build" in derived.reason
    for arch, sm in (("sm_90", "90"), ("sm_110", "110")):
        assert derived.cells[f"gelu/gelu_forward_kernel2<float>@{arch}"]["registers"] > 0
        record = json.loads((audited / arch / "gelu" / "build.json").read_text())
        calls = compressed.read_text(compressed.either(audited / arch / "gelu" /
                                                       "nvcc-calls.jsonl"))
        call = json.loads(calls.splitlines()[0])["argv"]
        assert "-arch=sm_80" not in call and f"arch=compute_{sm},code=[sm_{sm},compute_{sm}]" in call
        assert ["-Werror", "all-warnings"] == call[call.index("-Werror"):call.index("-Werror") + 2]
        assert "-O3" in call and "-Wall,-Wextra,-Werror" in call
        assert record["project"]["nvcc_calls"] == 1 and record["steps"][0]["tool"] == "project"


def test_a_build_that_calls_nvcc_by_path_is_refused(tmp_path):
    real = toolchains.for_arch("sm_90").compiler.path
    subject = _subject(tmp_path / "subject", (("kernels/kernels.toml", 'NVCC={nvcc}',
                                               f'NVCC={real}'),))
    build.build_into(subject, ["sm_90"], [], {}, tmp_path / "out", QUIET)
    derived = build.derive_builds(tmp_path / "out")
    assert derived.status is Status.FAIL
    assert "gelu sm_90: the build ran no nvcc through rowgate's wrapper" in derived.reason


def test_a_host_warning_in_the_projects_code_fails_under_the_injected_flags(tmp_path):
    subject = _subject(tmp_path / "subject", (("dev/cuda/gelu.cu", "  const int block = 256;",
                                               "  const int block = 256;\n  int unused = 0;"),))
    build.build_into(subject, ["sm_90"], [], {}, tmp_path / "out", QUIET)
    derived = build.derive_builds(tmp_path / "out")
    assert derived.status is Status.FAIL and "unused" in derived.reason, derived.reason


# ---------------------------------------------------------------- CMake, cuBLAS, NVTX

CMAKEPROJ = SUBJECTS / "cmakeproj"


def _cmake_subject(root: Path, edits: tuple[tuple[str, str, str], ...] = ()) -> Path:
    return _subject(root, edits, project=CMAKEPROJ, gelu_at="src/gelu.cu")


@pytest.fixture(scope="module")
def cmake_audited(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("cmakeproj")
    subject = _cmake_subject(tmp / "subject")
    audit.measure_audit(subject, ["sm_90", "sm_110"], [], {}, tmp / "out", QUIET)
    assert not (subject / "build").exists()
    return tmp / "out"


def test_a_cmake_project_with_cublas_and_nvtx_headers_builds_and_audits(cmake_audited):
    derived = audit.derive_audit(cmake_audited)
    assert build.derive_builds(cmake_audited).status is Status.PASS
    assert derived.status is Status.PASS, derived.reason
    for arch, sm in (("sm_90", "90"), ("sm_110", "110")):
        assert derived.cells[f"gelu/gelu_forward_kernel2<__nv_bfloat16>@{arch}"]["registers"] > 0
        record = json.loads((cmake_audited / arch / "gelu" / "build.json").read_text())
        assert [h["package"] for h in record["headers"]] == ["nvidia-cublas", "nvidia-nvtx"]
        assert record["project"]["unit"] == "gelu"
        assert sorted(Path(c).name for c in record["project"]["every_cubin"]) == [
            f"gelu.{arch}.cubin", f"matmul.{arch}.cubin"]
        calls = [json.loads(line) for line in compressed.read_text(compressed.either(
            cmake_audited / arch / "gelu" / "nvcc-calls.jsonl")).splitlines()]
        matmul = next(c for c in calls if any(a.endswith("src/matmul.cu") for a in c["argv"]))
        assert matmul["returncode"] == 0 and not matmul["probe"]
        assert any(a.startswith("-I") and "nvidia-cublas-" in a for a in matmul["argv"])
        assert "-arch=sm_80" not in matmul["argv"] and "--generate-code=arch=compute_80" not in \
            " ".join(matmul["argv"])
        assert f"arch=compute_{sm},code=[sm_{sm},compute_{sm}]" in matmul["argv"]
        # CMake's `nvcc -v __cmake_determine_cuda` fails by design: recorded, not judged
        assert any(c["probe"] and c["returncode"] != 0 for c in calls)


def test_without_the_nvtx_headers_declared_the_host_compiler_does_not_find_them(tmp_path):
    # trace.cpp is host code: g++ sees only what CPATH gives it (nvcc built from the
    # wheel would find any cu13 library header installed beside it in its own include dir)
    subject = _cmake_subject(tmp_path / "subject", (
        ("kernels/kernels.toml", 'headers = ["cublas", "nvtx"]', 'headers = ["cublas"]'),))
    build.build_into(subject, ["sm_90"], [], {}, tmp_path / "out", QUIET)
    derived = build.derive_builds(tmp_path / "out")
    assert derived.status is Status.FAIL, derived.reason
    assert "trace.cpp" in derived.reason and "nvtx3/nvToolsExt.h" in derived.reason


def test_a_unit_the_outputs_do_not_hold_is_named_with_the_units_they_do(tmp_path):
    subject = _cmake_subject(tmp_path / "subject", (
        ("kernels/kernels.toml", 'unit = "gelu"', 'unit = "softmax"'),))
    build.build_into(subject, ["sm_90"], [], {}, tmp_path / "out", QUIET)
    derived = build.derive_builds(tmp_path / "out")
    assert derived.status is Status.FAIL
    assert "unit 'softmax' is not among the sm_90 cubins" in derived.reason
    assert "gelu.sm_90.cubin" in derived.reason and "matmul.sm_90.cubin" in derived.reason


def test_a_failed_configure_is_named_by_the_build_tools_own_error(tmp_path):
    subject = _cmake_subject(tmp_path / "subject", (
        ("CMakeLists.txt", "set(CMAKE_CXX_STANDARD 17)",
         "find_package(RowgateNoSuchPackage REQUIRED)\nset(CMAKE_CXX_STANDARD 17)"),))
    build.build_into(subject, ["sm_90"], [], {}, tmp_path / "out", QUIET)
    derived = build.derive_builds(tmp_path / "out")
    assert derived.status is Status.FAIL
    assert "gelu sm_90: project exited 1: CMake Error at CMakeLists.txt:" in derived.reason
    assert "RowgateNoSuchPackage" in derived.reason, derived.reason


# ---------------------------------------------------------------- sm_70: the fetched nvcc


@pytest.mark.parametrize("project,gelu_at", [(MAKEPROJ, "dev/cuda/gelu.cu"),
                                             (CMAKEPROJ, "src/gelu.cu")], ids=["make", "cmake"])
def test_the_projects_own_build_builds_sm70_with_the_fetched_nvcc(sm70_nvcc, tmp_path, project,
                                                                  gelu_at):
    subject = _subject(tmp_path / "subject", project=project, gelu_at=gelu_at)
    audit.measure_audit(subject, ["sm_70"], [], {}, tmp_path / "out", QUIET)
    assert build.derive_builds(tmp_path / "out").status is Status.PASS
    derived = audit.derive_audit(tmp_path / "out")
    assert derived.status is Status.PASS, derived.reason
    cell = derived.cells["gelu/gelu_forward_kernel2<float>@sm_70"]
    assert cell["symbol"] == "_Z20gelu_forward_kernel2IfEvPT_PKS0_i" and cell["registers"] > 0
    record = json.loads((tmp_path / "out" / "sm_70" / "gelu" / "build.json").read_text())
    assert record["toolchain"]["name"] == "cuda-11.8-nvcc"
    calls = [json.loads(line) for line in compressed.read_text(compressed.either(
        tmp_path / "out" / "sm_70" / "gelu" / "nvcc-calls.jsonl")).splitlines()]
    gelu = next(c["argv"] for c in calls if any(a.endswith("gelu.cu") for a in c["argv"]))
    assert gelu[0] == str(sm70_nvcc) and "arch=compute_70,code=[sm_70,compute_70]" in gelu
    assert "-arch=sm_80" not in gelu and gelu[gelu.index("-ccbin") + 1].endswith("/g++-11")
    if project == CMAKEPROJ:  # cuBLAS and NVTX from the toolkit's own headers (11.8)
        assert [h["package"] for h in record["headers"]] == ["cuda-11.8-nvcc"] * 2


def test_a_projects_own_build_for_sm70_on_nvrtc_says_how_to_get_an_nvcc(tmp_path):
    subject = _subject(tmp_path / "subject")
    with pytest.raises(toolchains.ToolchainError) as exc:
        build.build_into(subject, ["sm_70"], [], {"nvcc_sm70": "nvrtc"}, tmp_path / "out", QUIET)
    assert str(exc.value) == ("cuda-12.8-nvrtc: a project's own build needs nvcc (sm_70 builds "
                              "through NVRTC here): rowgate toolchain fetch cuda-11.8, or "
                              "--option nvcc_sm70=PATH")


# ------------------------------------------- a linked program (llm.c's dev/cuda shape)

PROGRAM = """\
// A test program as llm.c's dev/cuda ones are: the kernels, a cuBLAS handle, a main.
#include <cstdio>
#include <cublas_v2.h>
#include "gelu.cu"

int main() {
  cublasHandle_t handle;
  std::printf("%d\\n", static_cast<int>(cublasCreate(&handle)));
  return 0;
}
"""
GLOBALS = """\
// Device data and no function (as the static runtime's image in llm.c's programs).
__device__ int gelu_calls;
"""
PROGRAM_RULE = """
# llm.c's rule: every test program is linked against cuBLAS
%: %.cu
\t$(NVCC) $(NVCCFLAGS) $^ -lcublas -lcublasLt -o $@

dev/cuda/gelu_prog: dev/cuda/globals.cu
"""


def _program_subject(root: Path) -> Path:
    subject = _subject(root, (("kernels/kernels.toml",
                               'commands = [["make", "NVCC={nvcc}", "build/gelu.o"]]',
                               'commands = [["make", "NVCC={nvcc}", "dev/cuda/gelu_prog"]]'),
                              ("kernels/kernels.toml", 'outputs = ["build/gelu.o"]',
                               'outputs = ["dev/cuda/gelu_prog"]'),
                              ("kernels/kernels.toml", "[kernels.gelu.build]",
                               'headers = ["cublas"]\n\n[kernels.gelu.build]')))
    (subject / "dev" / "cuda" / "gelu_prog.cu").write_text(PROGRAM)
    (subject / "dev" / "cuda" / "globals.cu").write_text(GLOBALS)
    with (subject / "Makefile").open("a") as f:
        f.write(PROGRAM_RULE)
    return subject


def _program_passes(out: Path, arch: str) -> dict:
    assert build.derive_builds(out).status is Status.PASS, build.derive_builds(out).reason
    derived = audit.derive_audit(out)
    assert derived.status is Status.PASS, derived.reason
    record = json.loads((out / arch / "gelu" / "build.json").read_text())
    # the program holds an image with no function too: nobody's kernel
    assert len(record["project"]["every_cubin"]) == 3  # gelu_prog, globals, and both
    assert record["project"]["cubins"] == [f"extract/0/gelu_prog.{arch}.cubin"]
    return record


def test_a_program_linked_against_cublas_builds_and_its_kernel_image_is_found(tmp_path):
    subject = _program_subject(tmp_path / "subject")
    audit.measure_audit(subject, ["sm_90"], [], {}, tmp_path / "out", QUIET)
    record = _program_passes(tmp_path / "out", "sm_90")
    link = [c for c in compressed.read_text(compressed.either(
        tmp_path / "out" / "sm_90" / "gelu" / "nvcc-calls.jsonl")).splitlines()]
    assert any("-lcublas" in line and '"-L' in line for line in link)
    assert record["headers"][0]["package"] == "nvidia-cublas"


def test_a_program_linked_against_cublas_builds_for_sm70_with_the_toolkits_stubs(sm70_nvcc,
                                                                                 tmp_path):
    subject = _program_subject(tmp_path / "subject")
    audit.measure_audit(subject, ["sm_70"], [], {}, tmp_path / "out", QUIET)
    record = _program_passes(tmp_path / "out", "sm_70")
    assert record["toolchain"]["name"] == "cuda-11.8-nvcc"
