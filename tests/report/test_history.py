"""`rowgate history ROW`: real bundles of one row over two commits, as table, JSON, CSV, PNG."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.signing import local_public_key
from tests.support import commit_file, thaw, write_row


def _run(args: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    return exc.value.code, out, err


@pytest.fixture
def two_bundles(git_repo, tmp_path, capsys) -> tuple[Path, list[Path]]:
    """A row with cells-free host gates; sealed at two commits. (evidence dir, bundles)."""
    row = write_row(tmp_path, "HIST", '''
        [[gates]]
        id = "host"
        kind = "host"
        commands = [["python", "-c", "print(1)"]]
    ''')
    evidence = tmp_path / "evidence"
    bundles = []
    for n in range(2):
        if n:
            commit_file(git_repo, "later.txt", "x\n", "a later change")
        code, out, _ = _run(["-q", "gate", str(row), "--repo", git_repo.working_dir,
                             "--out", str(evidence)], capsys)
        assert code == 0
        bundles.append(Path(out.strip().splitlines()[-1]))
    return evidence, bundles


def test_json_lists_every_bundle_oldest_first_with_the_metric(two_bundles, git_repo, capsys):
    evidence, bundles = two_bundles
    code, out, _ = _run(["history", "HIST", "--evidence", str(evidence), "--metric",
                         "host.commits_since_base", "--key", str(local_public_key()),
                         "--json"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["row"] == "HIST" and doc["series"] == ["(gate)"]
    assert [b["bundle_id"] for b in doc["bundles"]] == [b.name for b in bundles]
    first, second = doc["bundles"]
    assert second["commit"] == git_repo.head.commit.hexsha != first["commit"]
    assert (first["values"], second["values"]) == ({"(gate)": 1.0}, {"(gate)": 2.0})
    assert first["gates"] == {"host": "PASS"} and first["signature"] == "verified"


def test_csv_and_table_and_plot(two_bundles, tmp_path, capsys):
    evidence, bundles = two_bundles
    code, out, _ = _run(["history", "HIST", "--evidence", str(evidence), "--metric",
                         "host.commits_since_base", "--csv"], capsys)
    rows = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and [r["bundle"] for r in rows] == [b.name for b in bundles]
    assert [r["(gate)"] for r in rows] == ["1.0", "2.0"]
    assert {r["signature"] for r in rows} == {"not checked"}

    png = tmp_path / "plots" / "history.png"
    code, out, err = _run(["history", "HIST", "--evidence", str(evidence), "--metric",
                           "host.commits_since_base", "--plot", str(png)], capsys)
    assert code == 0 and png.read_bytes().startswith(b"\x89PNG") and f"wrote {png}" in err
    assert "signatures not checked" in out and bundles[1].name in out


def test_a_tampered_bundle_says_so_when_a_key_is_given(two_bundles, capsys):
    evidence, bundles = two_bundles
    thaw(bundles[0])
    (bundles[0] / "artifacts/host/status.txt").write_text("M edited\n")
    code, out, _ = _run(["history", "HIST", "--evidence", str(evidence), "--key",
                         str(local_public_key()), "--json"], capsys)
    first, second = json.loads(out)["bundles"]
    assert code == 0 and first["signature"].startswith("NOT verified: artifacts/host/status.txt")
    assert second["signature"] == "verified"


def test_an_unreadable_bundle_is_listed_and_exits_1(two_bundles, capsys):
    evidence, bundles = two_bundles
    thaw(bundles[1])
    (bundles[1] / "manifest.json").write_text("{not json")
    code, out, _ = _run(["history", "HIST", "--evidence", str(evidence), "--json"], capsys)
    doc = json.loads(out)
    assert code == 1 and len(doc["bundles"]) == 1
    assert doc["unreadable"][0]["path"] == str(bundles[1])


def test_usage_errors_name_what_is_wrong(two_bundles, capsys):
    evidence, _ = two_bundles
    code, _, err = _run(["history", "NOPE", "--evidence", str(evidence)], capsys)
    assert code == 2 and err.strip() == f"no bundles of row NOPE under {evidence} (rows there: HIST)"
    code, _, err = _run(["history", "HIST", "--evidence", str(evidence), "--metric",
                         "host.commits_since_bsae"], capsys)
    assert code == 2 and "did you mean host.commits_since_base?" in err
    code, _, err = _run(["history", "HIST", "--evidence", str(evidence), "--metric",
                         "hots.commands"], capsys)
    assert code == 2 and "did you mean 'host'?" in err
    code, _, err = _run(["history", "HIST", "--evidence", str(evidence), "--plot", "x.png"],
                        capsys)
    assert code == 2 and "--plot needs --metric" in err
