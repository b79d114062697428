"""The CLI contract reviewers and later stages script against."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.rows import ROWS_DIR
from tests.support import HOST_GATE, thaw, write_row


def _run(args: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def _gate(row: Path, repo, tmp_path, capsys) -> tuple[int, Path, str]:
    code, out, err = _run(["-q", "gate", str(row), "--repo", repo.working_dir,
                           "--out", str(tmp_path / "evidence")], capsys)
    return code, Path(out.strip().splitlines()[-1]), out


def test_gate_verify_inspect_round_trip(git_repo, host_row, tmp_path, capsys):
    code, bundle, out = _gate(host_row, git_repo, tmp_path, capsys)
    assert code == 0, out
    assert bundle.parent.name == "TEST-HOST" and (bundle / "manifest.json").is_file()
    assert "PASS" in out

    code, out, _ = _run(["verify", str(bundle)], capsys)
    assert code == 0 and out.startswith("OK ") and "signed by sha256:" in out

    code, out, _ = _run(["inspect", str(bundle), "--json"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["row"] == "TEST-HOST" and doc["gates"][0]["status"] == "PASS"
    assert doc["subject"]["commit"] == git_repo.head.commit.hexsha


def test_verify_names_the_first_problem(git_repo, host_row, tmp_path, capsys):
    _, bundle, _ = _gate(host_row, git_repo, tmp_path, capsys)
    thaw(bundle)
    (bundle / "artifacts" / "host" / "status.txt").write_text("tampered\n")
    code, out, err = _run(["verify", str(bundle)], capsys)
    assert code == 1 and out == ""
    assert err.strip().splitlines() == [err.strip()]
    assert err.startswith("artifacts/host/status.txt: sha256")


def test_verify_with_another_public_key_fails(git_repo, host_row, tmp_path, capsys, make_key):
    from pipeline.signing import KeySigner

    _, bundle, _ = _gate(host_row, git_repo, tmp_path, capsys)
    other = KeySigner(make_key("other")).public_key_file()
    code, _, err = _run(["verify", str(bundle), "--key", str(other)], capsys)
    assert code == 1 and "not by the expected key" in err


def test_verify_usage_errors(tmp_path, capsys):
    code, _, err = _run(["verify", str(tmp_path / "nope")], capsys)
    assert code == 2 and "not a bundle directory" in err
    code, _, err = _run(["verify", str(tmp_path), "--identity", "x"], capsys)
    assert code == 2


def test_pending_gate_exits_3_with_reason(git_repo, tmp_path, capsys):
    row = write_row(tmp_path, "NEEDS-THOR", HOST_GATE + '''
        [[gates]]
        id = "tokens"
        kind = "tokens"

        [[pending]]
        gate = "tokens"
        reason = "no Thor here"
        until = "a Thor runner runs it"
    ''')
    row.write_text(row.read_text().replace('arch = "cpu"', 'arch = "sm_110"\ndevice = "thor:gpu0"'))
    code, bundle, out = _gate(row, git_repo, tmp_path, capsys)
    assert code == 3, out
    _, out, _ = _run(["inspect", str(bundle), "--json"], capsys)
    tokens = json.loads(out)["gates"][1]
    assert tokens["status"] == "PENDING"
    assert "needs an sm_110 device (thor:gpu0)" in tokens["reason"]
    assert "until a Thor runner runs it" in tokens["reason"]


def test_unbuilt_gate_kind_is_error_not_pending(git_repo, tmp_path, capsys, monkeypatch):
    from pipeline import gates

    monkeypatch.delitem(gates.IMPLEMENTED, "host")  # a kind this build does not have
    row = write_row(tmp_path, "UNBUILT", HOST_GATE)
    code, bundle, out = _gate(row, git_repo, tmp_path, capsys)
    assert code == 1
    _, out, _ = _run(["inspect", str(bundle), "--json"], capsys)
    result = json.loads(out)["gates"][0]
    assert result["status"] == "ERROR" and result["reason"].startswith("not implemented")


def test_unknown_row_is_usage_error(capsys):
    code, out, err = _run(["gate", "NO-SUCH-ROW"], capsys)
    assert code == 2 and "no row 'NO-SUCH-ROW'" in err and "Traceback" not in err


def test_bad_option_is_usage_error(host_row, git_repo, capsys):
    code, _, err = _run(["gate", str(host_row), "--repo", git_repo.working_dir, "--option", "novalue"],
                        capsys)
    assert code == 2 and "--option 'novalue'" in err


def test_not_a_repo_is_usage_error(host_row, tmp_path, capsys):
    code, _, err = _run(["gate", str(host_row), "--repo", str(tmp_path)], capsys)
    assert code == 2 and "not a git repository" in err


def test_checked_in_schemas_match_the_models(capsys):
    code, out, _ = _run(["schemas", "--check"], capsys)
    assert code == 0, out


@pytest.mark.slow
def test_thor_row_on_a_cpu_machine_is_honest(git_repo, tmp_path, capsys):
    """Every gate of the Thor row gets an honest status here: device gates PENDING
    saying sm_110, nothing silently passing, nothing ERROR for lack of code."""
    code, bundle, out = _gate(ROWS_DIR / "PERF-THOR-DECODE-PARITY.toml", git_repo, tmp_path, capsys)
    _, out, _ = _run(["inspect", str(bundle), "--json"], capsys)
    results = {g["gate_id"]: g for g in json.loads(out)["gates"]}
    for gate_id in ("tokens", "trace", "throughput"):
        assert results[gate_id]["status"] == "PENDING"
        assert "needs an sm_110 device (thor:gpu0)" in results[gate_id]["reason"]
    assert results["host"]["status"] == "PASS"
    assert all(r["reason"] for r in results.values())
    assert code in (1, 3)
