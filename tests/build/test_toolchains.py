"""Toolchains found in the installed wheels (the cuda12 / cuda13 extras), pinned."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rowgate.cuda import toolchains


def test_sm70_is_cuda_12_8_nvrtc_with_12_8_sass_tools():
    tc = toolchains.for_arch("sm_70")
    assert (tc.name, tc.kind) == ("cuda-12.8-nvrtc", "nvrtc")
    assert tc.compiler.version == tc.compiler.package_version == "12.8.93"
    assert tc.ptxas is not None and tc.ptxas.version == "12.8.93"
    # CUDA 13's cuobjdump refuses sm_70 SASS: these must be a 12.x build.
    assert tc.cuobjdump is not None and tc.cuobjdump.version.startswith("12.8.")
    assert tc.nvdisasm is not None and tc.nvdisasm.version.startswith("12.8.")
    assert tc.sass_missing == ""


@pytest.mark.parametrize("arch", ["sm_90", "sm_90a", "sm_110"])
def test_sm90_and_thor_are_cuda_13_nvcc(arch):
    tc = toolchains.for_arch(arch)
    assert (tc.name, tc.kind, tc.compiler.version) == ("cuda-13-nvcc", "nvcc", "13.5.37")
    assert tc.compiler.package == "nvidia-cuda-nvcc"
    assert tc.cuobjdump.version == tc.nvdisasm.version == "13.5.37"
    assert tc.host_compiler is not None and tc.host_compiler.version


def test_explicit_nvcc_is_used_and_recorded():
    wheel = toolchains.for_arch("sm_110")
    tc = toolchains.for_arch("sm_110", nvcc=wheel.compiler.path)
    assert tc.compiler.package == toolchains.EXPLICIT and tc.compiler.version == "13.5.37"
    # Its own sibling cuobjdump comes with it: one toolkit, one version.
    assert tc.cuobjdump.package == toolchains.EXPLICIT


def test_explicit_nvcc_must_exist_and_be_cuda_13(tmp_path):
    with pytest.raises(toolchains.ToolchainError, match="no such file"):
        toolchains.for_arch("sm_90", nvcc=str(tmp_path / "nvcc"))
    cuda12_binary = toolchains.for_arch("sm_70").ptxas.path  # a real CUDA 12.8 tool
    with pytest.raises(toolchains.ToolchainError, match=r"is CUDA 12\.8\.93.*need CUDA 13"):
        toolchains.for_arch("sm_90", nvcc=cuda12_binary)


def test_cache_identity_is_versions_not_paths():
    tc = toolchains.for_arch("sm_90")
    moved = replace(tc, compiler=replace(tc.compiler, path="/elsewhere/nvcc"))
    assert moved.digest() == tc.digest()
    bumped = replace(tc, compiler=replace(tc.compiler, version="13.5.38"))
    assert bumped.digest() != tc.digest()


def test_installed_reports_both_toolchains():
    got = toolchains.installed()
    assert got["cuda-12.8-nvrtc"].startswith("12.8.93, ptxas 12.8.93")
    assert got["cuda-13-nvcc"].startswith("13.5.37, cuobjdump 13.5.37")


def test_header_wheels_are_pinned_and_part_of_the_cache_identity():
    tc = toolchains.for_arch("sm_110")
    assert tc.headers["nvidia-cuda-cccl"] == "13.3.5.0.6"  # nv/target for cuda_fp16.h
    assert tc.headers["nvidia-cuda-crt"] == "13.5.37"
    assert replace(tc, headers={**tc.headers, "nvidia-cuda-cccl": "13.2.86"}).digest() != tc.digest()
    old = toolchains.for_arch("sm_70")
    assert old.headers == {"nvidia-cuda-runtime-cu12": "12.8.90", "nvidia-cuda-cccl-cu12": "12.8.90"}
    assert len(old.include_dirs) == 2  # NVRTC gets the 12.8 cudart and CCCL headers


def test_an_explicit_nvcc_without_binutils_builds_and_the_audit_says_where_it_looked(
        tmp_path, monkeypatch):
    """`--option nvcc=PATH` whose directory has no cuobjdump, and no cuobjdump wheel: the
    toolchain still builds (a build needs no binutils); the audit refuses in one line
    naming both places it looked."""
    from importlib import metadata

    from rowgate.gates.audit import measure_audit
    from rowgate.gates.interface import GateError

    nvcc = tmp_path / "cuda" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.symlink_to(toolchains.for_arch("sm_90").compiler.path)
    real = metadata.distribution

    def without_binutils(name: str):
        if name in ("nvidia-cuda-cuobjdump", "nvidia-cuda-nvdisasm"):
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(metadata, "distribution", without_binutils)
    tc = toolchains.for_arch("sm_90", nvcc=str(nvcc))
    assert tc.compiler.path == str(nvcc) and tc.cuobjdump is None
    said = (f"no cuobjdump beside option nvcc={nvcc} ({nvcc.parent / 'cuobjdump'}), and "
            f"nvidia-cuda-cuobjdump is not installed: ")
    assert tc.binutils_missing.startswith(said)
    with pytest.raises(GateError, match=r"^audit gate: sm_90: no cuobjdump beside option"):
        measure_audit(tmp_path, ["sm_90"], [], {"nvcc": str(nvcc)}, tmp_path / "out",
                      progress=None)  # type: ignore[arg-type]  # refused before any progress
    assert not (tmp_path / "out").exists()
