"""Library headers from their wheels (rowgate.cuda.library_headers): each declared
library's own include files, copied once into a directory of its own in rowgate's cache."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pytest

from rowgate.cuda import library_headers, toolchains
from rowgate.cuda.toolchains import ToolchainError


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("ROWGATE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_each_library_gets_only_its_own_wheels_headers(cache):
    chain = toolchains.for_arch("sm_90")
    cublas, nvtx = library_headers.resolve(["cublas", "nvtx"], chain)
    assert (cublas.package, nvtx.package) == ("nvidia-cublas", "nvidia-nvtx")
    inc = Path(cublas.include_dir)
    assert (inc / "cublas_v2.h").is_file() and inc.is_relative_to(cache)
    # the cu13 wheels share one include dir: cudart's headers must not come along
    assert not (inc / "cuda_runtime.h").exists() and not (inc / "nvtx3").exists()
    assert (Path(nvtx.include_dir) / "nvtx3" / "nvToolsExt.h").is_file()
    marker = (inc.parent / library_headers.MARKER).read_text()
    assert "cublas_v2.h" in marker
    again = library_headers.resolve(["cublas"], chain)[0]  # reused, not copied again
    assert again == cublas and (inc.parent / library_headers.MARKER).read_text() == marker


def test_a_library_whose_wheel_is_missing_says_what_to_install(cache, monkeypatch):
    monkeypatch.setitem(library_headers.LIBRARIES, "cublas",
                        {"nvcc": "nvidia-cublas-not-installed", "nvrtc": "x"})
    with pytest.raises(ToolchainError) as err:
        library_headers.resolve(["cublas"], toolchains.for_arch("sm_90"))
    assert err.value.diagnostics() == (
        "headers: cublas needs nvidia-cublas-not-installed, which is not installed: "
        "pip install 'rowgate[cuda13-libs]'")


def test_a_header_only_host_library_comes_without_its_python_files(cache):
    (json,) = library_headers.resolve(["nlohmann-json"], toolchains.for_arch("sm_90"))
    inc = Path(json.include_dir)
    assert json.package == "nlohmann-json" and (inc / "nlohmann" / "json.hpp").is_file()
    assert not list(inc.rglob("*.py")) and not list(inc.rglob("*.pyc"))


def test_a_missing_host_library_names_its_own_extra(cache, monkeypatch):
    monkeypatch.setitem(library_headers.LIBRARIES, "nlohmann-json",
                        {"nvcc": "nlohmann-json-not-installed", "nvrtc": "x"})
    with pytest.raises(ToolchainError, match=r"pip install 'rowgate\[host-libs\]'"):
        library_headers.resolve(["nlohmann-json"], toolchains.for_arch("sm_90"))


def test_torch_headers_need_a_cuda_build_of_torch(cache):
    # the test environment's torch is rowgate[engines]' CPU build: its c10/cuda headers
    # include a file only a CUDA build generates, so a compile would fail on it later
    version = metadata.version("torch")
    with pytest.raises(ToolchainError) as err:
        library_headers.resolve(["torch"], toolchains.for_arch("sm_90"))
    assert err.value.diagnostics() == (
        f"headers: torch {version} is a CPU build (no c10/cuda/impl/cuda_cmake_macros.h): "
        f"its headers cannot compile CUDA code; install a CUDA build of torch")
    assert not (cache / "headers").exists() or not any((cache / "headers").glob("torch-*"))


def test_torch_headers_need_a_host_compiler(cache):
    nvrtc = toolchains.for_arch("sm_70")  # the tests' empty data dir: sm_70 is NVRTC's
    assert nvrtc.kind == "nvrtc"
    with pytest.raises(ToolchainError) as err:
        library_headers.resolve(["torch"], nvrtc)
    assert err.value.diagnostics() == (
        f"headers: torch's C++ headers need a host compiler; {nvrtc.name} compiles device "
        f"code only (NVRTC)")


def test_torch_brings_the_libraries_its_cuda_headers_include(cache, monkeypatch):
    asked: list[str] = []
    monkeypatch.setattr(library_headers, "_found", lambda name, chain: asked.append(name))
    library_headers.check(["cublas", "torch", "nvtx"], toolchains.for_arch("sm_90"))
    assert asked == ["cublas", "torch", "cusparse", "cusolver", "nvtx"]  # each once
