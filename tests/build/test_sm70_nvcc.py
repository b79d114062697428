"""The sm_70 nvcc: Debian 12's CUDA 11.8 that `rowgate toolchain fetch cuda-11.8` brings
(nox -s tests fetches it on Debian 12), found as a user's rowgate finds it, chosen over
the wheels' NVRTC unless `nvcc_sm70=nvrtc`; an explicit `nvcc_sm70=PATH` must be a CUDA
10-12 nvcc. The fetch's source list is the machine's own, with non-free added."""

from __future__ import annotations

from pathlib import Path

import pytest

from rowgate.cli.main import main
from rowgate.cuda import debian_toolkit, toolchains


def test_the_fetched_toolkit_builds_sm70_through_g_plus_plus_11(sm70_nvcc):
    tc = toolchains.for_arch("sm_70")
    assert (tc.name, tc.kind) == ("cuda-11.8-nvcc", "nvcc")
    assert tc.compiler.path == str(sm70_nvcc) and tc.compiler.version == "11.8.89"
    assert tc.compiler.package_version == debian_toolkit.VERSION
    assert tc.ccbin.endswith("/g++-11") and tc.host_compiler.version.startswith("11.")
    # its own SASS tools read sm_70 (CUDA 13's refuse it)
    assert tc.cuobjdump.version.startswith("11.8.") and tc.nvdisasm.version.startswith("11.8.")
    assert (Path(tc.own_headers) / "cublas_v2.h").is_file()
    assert (Path(tc.own_headers) / "nvtx3" / "nvToolsExt.h").is_file()
    assert set(tc.headers) == {p.name for p in debian_toolkit.PACKAGES[1:]}
    assert debian_toolkit.manifest()["packages"]["nvidia-cuda-toolkit"]["version"] == \
        debian_toolkit.VERSION
    # sm_90 stays on CUDA 13
    assert toolchains.for_arch("sm_90").name == "cuda-13-nvcc"


def test_nvrtc_is_still_there_when_asked_for(sm70_nvcc):
    assert toolchains.for_options("sm_70", {"nvcc_sm70": "nvrtc"}).name == "cuda-12.8-nvrtc"


def test_an_explicit_sm70_nvcc_is_recorded_as_given(sm70_nvcc):
    tc = toolchains.for_options("sm_70", {"nvcc_sm70": str(sm70_nvcc)})
    assert tc.compiler.package == toolchains.EXPLICIT and tc.compiler.version == "11.8.89"
    assert tc.ccbin == ""  # the operator's toolkit, with its own default host compiler


def test_without_a_fetched_toolkit_sm70_is_the_wheels_nvrtc():
    # the tests' data dir is empty (tests/conftest.py): a pip-only install
    assert debian_toolkit.nvcc() is None
    assert toolchains.for_arch("sm_70").name == "cuda-12.8-nvrtc"


def test_an_explicit_sm70_nvcc_must_exist_and_be_cuda_10_to_12(tmp_path):
    with pytest.raises(toolchains.ToolchainError, match=r"nvcc_sm70=.*: no such file"):
        toolchains.for_options("sm_70", {"nvcc_sm70": str(tmp_path / "nvcc")})
    cuda13 = toolchains.for_arch("sm_90").compiler.path
    with pytest.raises(toolchains.ToolchainError, match=r"is CUDA 13\.5\.37: sm_70 needs CUDA "
                                                         r"10 to 12 \(CUDA 13 dropped it\)"):
        toolchains.for_options("sm_70", {"nvcc_sm70": cuda13})


DEB822 = """\
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
"""


def test_the_source_list_is_the_machines_own_with_non_free_added():
    stanzas = debian_toolkit._deb822(DEB822)
    assert [s["Suites"] for s in stanzas] == ["bookworm bookworm-updates", "bookworm-security"]
    one = debian_toolkit._one_line(
        "# a comment\ndeb [arch=amd64 signed-by=/k.gpg] http://m.example/debian bookworm main\n"
        "deb-src http://m.example/debian bookworm main\n")
    assert one == [{"Types": "deb", "URIs": "http://m.example/debian", "Suites": "bookworm",
                    "Signed-By": "/k.gpg"}]


def test_the_fetch_writes_the_bookworm_suite_only(monkeypatch, tmp_path):
    parts = tmp_path / "sources.list.d"
    parts.mkdir()
    (parts / "debian.sources").write_text(DEB822)
    real = Path

    def fake(p: str = "", *rest: str) -> Path:
        if p == "/etc/apt/sources.list.d":
            return parts
        if p == "/etc/apt/sources.list":
            return tmp_path / "absent.list"
        return real(p, *rest)

    monkeypatch.setattr(debian_toolkit, "Path", fake)
    text = debian_toolkit._sources()
    assert text == ("Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\n"
                    "Components: main contrib non-free\n"
                    "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n")


def test_off_debian_12_the_fetch_is_one_configuration_line(monkeypatch, capsys):
    monkeypatch.setattr(debian_toolkit, "_os_release", lambda: {"VERSION_CODENAME": "trixie"})
    with pytest.raises(SystemExit) as exc:
        main(["toolchain", "fetch", "cuda-11.8", "-q"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["cuda-11.8 is Debian 12's (bookworm) package; this machine "
                   "is trixie: give an sm_70 nvcc (CUDA 10-12) with --option nvcc_sm70=PATH"]


def test_the_list_names_each_arch_toolchain(sm70_nvcc, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["toolchain", "list"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "cuda-11.8-nvcc" in out and "cuda-13-nvcc" in out


def test_a_second_fetch_finds_the_toolkit_and_downloads_nothing(sm70_nvcc, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["toolchain", "fetch", "cuda-11.8"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == str(sm70_nvcc)
