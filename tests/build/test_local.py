"""`rowgate build --arch …`: the resource table and the exit codes (real compiles)."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from rowgate.cli.main import main
from tests.support import LAB

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def _run(args: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def test_build_sm70_prints_every_entry_point(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    shutil.copytree(LAB / "kernels", tmp_path / "kernels")
    code, out, err = _run(["-q", "build", "--arch", "sm_70", "--repo", str(tmp_path)], capsys)
    assert code == 0, out + err
    for entry in ("decode_attention_bf16_hd64", "decode_attention_e5m2_hd128"):
        assert entry in out
    assert "build: PASS" in out and "audit: PASS" in out
    from rowgate.cuda import cache

    assert (cache.reports(tmp_path, ["sm_70"]) / "audit.json").is_file()
    assert not (tmp_path / "build").exists()  # nothing written into the subject


def test_build_failure_exits_1_with_the_violation(tmp_path, capsys):
    (tmp_path / "kernels" / "include").mkdir(parents=True)
    shutil.copyfile(REPO / "tests" / "fixtures" / "kernels" / "clean.cu",
                    tmp_path / "kernels" / "clean.cu")
    (tmp_path / "kernels" / "kernels.toml").write_text(textwrap.dedent('''
        version = 1
        [kernels.k]
        source = "clean.cu"
        entry_points = ["scale"]
        arches = ["sm_70"]
        [kernels.k.budgets.all]
        max_registers = 2
    '''))
    code, out, _ = _run(["-q", "build", "--arch", "sm_70", "--repo", str(tmp_path)], capsys)
    assert code == 1
    assert "audit: FAIL" in out and "exceeds budget 2" in out


def test_bad_arch_is_a_usage_error(tmp_path, capsys):
    code, _, err = _run(["build", "--arch", "sm70", "--repo", str(tmp_path)], capsys)
    assert code == 2 and "--arch 'sm70'" in err


def test_an_arch_without_a_toolchain_is_one_configuration_line(tmp_path, capsys):
    shutil.copytree(LAB / "kernels", tmp_path / "kernels")
    missing = tmp_path / "nowhere" / "nvcc"
    code, out, err = _run(["build", "--arch", "sm_110", "--repo", str(tmp_path),
                           "--option", f"nvcc={missing}"], capsys)
    assert code == 2 and out == ""
    assert err.strip() == (f"rowgate build --arch sm_110: no toolchain: option "
                           f"nvcc={missing}: no such file"), err
