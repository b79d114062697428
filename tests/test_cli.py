"""The CLI contract reviewers and later stages script against."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rowgate.cli.main import main
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


def _own_key() -> str:
    from rowgate.seal.signing import local_public_key

    return str(local_public_key())


def test_gate_verify_inspect_round_trip(git_repo, host_row, tmp_path, capsys):
    code, bundle, out = _gate(host_row, git_repo, tmp_path, capsys)
    assert code == 0, out
    assert bundle.parent.name == "TEST-HOST" and (bundle / "manifest.json").is_file()
    assert "PASS" in out

    code, out, _ = _run(["verify", str(bundle), "--key", _own_key()], capsys)
    assert code == 0 and out.startswith("OK ") and "signed by sha256:" in out

    code, out, _ = _run(["inspect", str(bundle), "--json"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["row"] == "TEST-HOST" and doc["gates"][0]["status"] == "PASS"
    assert doc["subject"]["commit"] == git_repo.head.commit.hexsha


def test_verify_names_the_first_problem(git_repo, host_row, tmp_path, capsys):
    _, bundle, _ = _gate(host_row, git_repo, tmp_path, capsys)
    thaw(bundle)
    (bundle / "artifacts" / "host" / "status.txt").write_text("tampered\n")
    code, out, err = _run(["verify", str(bundle), "--key", _own_key()], capsys)
    assert code == 1 and out == ""
    assert err.strip().splitlines() == [err.strip()]
    assert err.startswith("artifacts/host/status.txt: sha256")


def test_verify_with_another_public_key_fails(git_repo, host_row, tmp_path, capsys, make_key):
    from rowgate.seal.signing import KeySigner

    _, bundle, _ = _gate(host_row, git_repo, tmp_path, capsys)
    other = KeySigner(make_key("other")).public_key_file()
    code, _, err = _run(["verify", str(bundle), "--key", str(other)], capsys)
    assert code == 1 and "not by the expected key" in err


def test_verify_usage_errors(tmp_path, capsys):
    code, _, err = _run(["verify", str(tmp_path / "nope"), "--key", "k.pem"], capsys)
    assert code == 2 and "not a bundle directory" in err
    code, _, err = _run(["verify", str(tmp_path), "--identity", "x"], capsys)
    assert code == 2


def test_verify_needs_the_signers_key_and_names_your_own(git_repo, host_row, tmp_path, capsys):
    """No implicit key: the local one would make every bundle someone else signed read
    'not by the expected key'. The error says where your own public key is."""
    _, bundle, _ = _gate(host_row, git_repo, tmp_path, capsys)
    code, out, err = _run(["verify", str(bundle)], capsys)
    assert code == 2 and out == ""
    assert err.strip() == (f"verify: pass --key PUB.pem of the signer (or --identity and "
                           f"--issuer for a keyless signature); your own key's public half is "
                           f"{_own_key()}")


def test_verify_json_for_scripts_valid_and_invalid(git_repo, host_row, tmp_path, capsys):
    _, bundle, _ = _gate(host_row, git_repo, tmp_path, capsys)
    code, out, _ = _run(["verify", str(bundle), "--key", _own_key(), "--json"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["ok"] and doc["row"] == "TEST-HOST" and doc["id"] == bundle.name
    assert doc["verified_as"] == doc["signer"] and doc["commit"] == git_repo.head.commit.hexsha
    thaw(bundle)
    (bundle / "artifacts" / "host" / "status.txt").write_text("tampered\n")
    code, out, err = _run(["verify", str(bundle), "--key", _own_key(), "--json"], capsys)
    doc = json.loads(out)
    assert code == 1 and not doc["ok"] and doc["problem"].startswith("artifacts/host/status.txt")
    assert err.startswith("artifacts/host/status.txt: sha256")


def test_gate_json_is_the_sealed_bundle(git_repo, host_row, tmp_path, capsys):
    code, out, _ = _run(["-q", "gate", str(host_row), "--repo", git_repo.working_dir,
                         "--out", str(tmp_path / "evidence"), "--json"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["status"] == "PASS" and doc["gates"][0]["gate_id"] == "host"
    assert Path(doc["bundle"]).parent.name == "TEST-HOST"


def test_every_subcommand_lists_its_exit_codes_and_takes_q(capsys):
    from rowgate.cli.main import EXIT_CODES

    for argv in (["gate"], ["verify"], ["inspect"], ["rows"], ["rows", "check"], ["review"],
                 ["attest-operator"], ["merge"], ["report"], ["history"], ["build"],
                 ["oracle"], ["oracle", "record"], ["oracle", "verify"], ["schemas"]):
        code, out, _ = _run([*argv, "--help"], capsys)
        text = " ".join(out.split())
        assert code == 0 and "exit codes: " in text, argv
        assert " ".join(EXIT_CODES[argv[0]].split()) in text, argv
        assert "-q, --quiet" in out, argv


def test_q_after_a_nested_subcommand_and_no_doubled_prefix(tmp_path, capsys):
    code, _, err = _run(["oracle", "verify", str(tmp_path), "-q"], capsys)
    assert code == 2 and "unrecognized" not in err  # -q is accepted; the key is what's missing
    code, _, err = _run(["oracle", "verify", str(tmp_path), "--bogus"], capsys)
    assert code == 2 and err == "rowgate: error: unrecognized arguments: --bogus\n"
    code, _, err = _run(["oracle", "verify"], capsys)  # reported by the nested parser
    assert err == "rowgate: error: oracle verify: the following arguments are required: record\n"
    code, _, err = _run(["--bogus"], capsys)
    assert err.startswith("rowgate: error: ") and "rowgate: error: rowgate" not in err


def test_an_option_no_gate_reads_is_refused_with_the_closest_key(host_row, git_repo, tmp_path,
                                                                 capsys):
    row = write_row(tmp_path, "OPTS", HOST_GATE + '''
        [[gates]]
        id = "build"
        kind = "build"
    ''')
    code, out, err = _run(["gate", str(row), "--repo", git_repo.working_dir,
                           "--out", str(tmp_path / "ev"), "--option", "nvc=/opt/nvcc"], capsys)
    assert code == 2 and out == "" and not (tmp_path / "ev").exists()
    assert err.strip() == ("--option nvc: not read by row OPTS's gates; did you mean 'nvcc'? "
                           "(accepted: nvcc, nvcc_sm70)")
    code, _, err = _run(["gate", str(host_row), "--repo", git_repo.working_dir,
                         "--option", "nvcc=/x"], capsys)
    assert code == 2 and "--option nvcc: not read by row TEST-HOST's gates" in err
    assert "(accepted: none)" in err
    code, _, err = _run(["build", "--arch", "sm_90", "--option", "cubin=x"], capsys)
    assert code == 2 and err.startswith("--option cubin: not read by rowgate build")


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


def test_a_gate_kind_nothing_installed_provides_is_one_line_naming_the_installed(git_repo, tmp_path,
                                                                                capsys):
    row = write_row(tmp_path, "UNBUILT", HOST_GATE.replace('kind = "host"', 'kind = "hots"'))
    code, out, err = _run(["gate", str(row), "--repo", git_repo.working_dir], capsys)
    assert code == 2 and "Traceback" not in err
    line = next(x for x in err.splitlines() if "hots" in x)
    assert "gate kind 'hots' is not installed (installed: " in line and "host" in line


def test_unknown_row_is_usage_error(capsys):
    code, out, err = _run(["gate", "NO-SUCH-ROW"], capsys)
    assert code == 2 and "no row 'NO-SUCH-ROW'" in err and "Traceback" not in err


@pytest.mark.parametrize("argv", [["rows"], ["gate", "DEMO-CPU-DECODE"]])
def test_a_rows_directory_that_is_not_one_is_usage_error(argv, tmp_path, monkeypatch, capsys):
    """A mistyped --rows or $ROWGATE_ROWS would otherwise list, or find, the demos alone."""
    missing = tmp_path / "rwos"
    code, out, err = _run([*argv, "--rows", str(missing)], capsys)
    assert code == 2 and err.strip() == f"--rows {missing}: not a directory", err
    monkeypatch.setenv("ROWGATE_ROWS", f"{tmp_path}:{missing}")
    code, out, err = _run(argv, capsys)
    assert code == 2 and err.strip() == f"$ROWGATE_ROWS {missing}: not a directory"


def test_python_m_rowgate_is_the_rowgate_command():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "rowgate", "--help"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("usage: rowgate "), done.stderr


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


def test_an_informational_gate_is_shown_and_does_not_count(git_repo, tmp_path, capsys):
    """`required = false`: its FAIL is in the table, marked, and the bundle is PASS (the
    review treats it the same way), so a noisy informational A/B cannot fail a row."""
    row = write_row(tmp_path, "INFO", HOST_GATE + '''
        [[gates]]
        id = "host-extra"
        kind = "host"
        required = false
        commands = [["python", "-c", "import sys; sys.exit(3)"]]
    ''')
    code, bundle, out = _gate(row, git_repo, tmp_path, capsys)
    assert code == 0 and "INFO: PASS" in out and "informational" in out
    _, out, _ = _run(["inspect", str(bundle), "--json"], capsys)
    doc = json.loads(out)
    assert doc["status"] == "PASS" and doc["gates"][1]["status"] == "FAIL"
    assert doc["informational"] == ["host-extra"]
    _, out, _ = _run(["inspect", str(bundle)], capsys)
    assert re.search(r"host-extra.*FAIL\s.*\n.*informational", out), out
    html, md = tmp_path / "r.html", tmp_path / "r.md"
    _run(["report", str(bundle), "--key", _own_key(), "--html", str(html), "--markdown", str(md)],
         capsys)
    page = html.read_text()
    assert '<span class="verdict INFORMATIONAL">FAIL (informational)</span>' in page
    assert '<td class="status INFORMATIONAL">FAIL (informational)</td>' in page
    assert '<td class="status FAIL">' not in page
    text = md.read_text()
    assert "ℹ️ FAIL (informational)" in text and "❌" not in text


def test_review_json_is_the_record_and_its_path(tmp_path, monkeypatch, capsys):
    from tests.review_support import World

    world = World(tmp_path, monkeypatch, capsys)
    row = world.row()
    code, out, _ = world.review(world.gate(row), row, "--json")
    doc = json.loads("\n".join(out))
    assert code == 0 and doc["record"]["verdict"] == "APPROVE"
    assert Path(doc["path"]).is_file() and json.loads(Path(doc["path"]).read_text()) == doc["record"]


def test_where_the_time_went_is_sealed_shown_and_planned_from(git_repo, host_row, tmp_path,
                                                              capsys):
    """Each gate's wall time split into phases is sealed in its result (they add up to
    its duration); inspect and the report show it; the next plan estimates from it."""
    code, bundle, _ = _gate(host_row, git_repo, tmp_path, capsys)
    assert code == 0
    _, out, _ = _run(["inspect", str(bundle), "--json"], capsys)
    host = json.loads(out)["gates"][0]
    assert {"commands", "derive"} <= set(host["phases"]), host["phases"]
    assert abs(sum(host["phases"].values()) - host["duration_s"]) < 0.01 + 0.05 * host["duration_s"]
    _, out, _ = _run(["inspect", str(bundle)], capsys)
    # a number and its unit never part: a no-break space (U+00A0) between them
    assert re.search(r"time.*\n(.*\n)*.*host.*commands [0-9.]+\xa0s\xa0\(\d+\xa0%\)", out), out
    # overhead: everything but the commands the host gate ran (derive, requirements…)
    from rowgate.gates.clock import WORK

    spent = host["duration_s"] - sum(s for k, s in host["phases"].items() if k in WORK)
    assert re.search(rf"host\s*│\s*{host['duration_s']:.1f}\s*│\s*{max(spent, 0):.1f}\xa0s"
                     rf"\xa0\(\d+\xa0%\)", out), out
    html = tmp_path / "r.html"
    _run(["report", str(bundle), "--key", _own_key(), "--html", str(html)], capsys)
    page = html.read_text()
    assert '<section id="time"><h2>Time</h2><figure><img src="data:image/png;base64,' in page
    assert "<td>all gates</td>" in page and "<th>overhead</th>" in page
    _, out, _ = _run(["gate", str(host_row), "--repo", git_repo.working_dir, "--plan",
                      "--out", str(tmp_path / "evidence")], capsys)
    assert f"time: {host['duration_s']:.0f} s in the row's last sealed bundle ({bundle.name}: " \
           f"commands" in out, out
