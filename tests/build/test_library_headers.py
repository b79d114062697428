"""Library headers from their wheels (rowgate.cuda.library_headers): each declared
library's own include files, copied once into a directory of its own in rowgate's cache."""

from __future__ import annotations

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
