"""`rowgate history ROW`: real bundles of one row over two commits, as table, JSON, CSV, PNG."""

from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path

import pytest

from rowgate.cli.main import main
from rowgate.seal.signing import local_public_key
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


FIXTURE = Path(__file__).resolve().parents[1] / "data/bundles"
FIXTURE_ROW = "FIXTURE-SEALED-B68C77E"


@pytest.fixture
def across_formats(tmp_path, git_repo, make_key) -> tuple[Path, Path, Path]:
    """One row's history across the throughput gate's change of format: the bundle an
    older rowgate sealed (format 1), then one the gate measures now (format 2: its own
    measure and derive, on synthetic engines). (evidence dir, format-1, format-2 bundle)"""
    from tests.gates.test_timed_rounds import cal
    from tests.report import format2

    evidence = tmp_path / "evidence"
    old = evidence / FIXTURE_ROW / "9e0039fa90883e48"
    shutil.copytree(FIXTURE / FIXTURE_ROW / old.name, old)
    new = format2.seal(evidence, FIXTURE / f"{FIXTURE_ROW}.toml", Path(git_repo.working_dir),
                       make_key(), {"oracle": 0.6, "candidate": 0.6}, 7,
                       cal.synthetic_passes((1, 2)))
    return evidence, old, new


def _cells(bundle: Path) -> dict[str, dict]:
    return json.loads((bundle / "gates/throughput.json").read_text())["cells"]


@pytest.mark.parametrize("name,read_1,read_2", [
    ("output_throughput_ratio", "ratio_median", "output_throughput_ratio"),
    ("ratio_median", "ratio_median", "output_throughput_ratio"),
    ("tpot_ratio", "tpot_ratio_median", "tpot_ratio")])
def test_a_throughput_quantity_is_followed_across_formats(across_formats, capsys, name,
                                                          read_1, read_2):
    evidence, old, new = across_formats
    code, out, _ = _run(["history", FIXTURE_ROW, "--evidence", str(evidence), "--metric",
                         f"throughput.{name}", "--json"], capsys)
    doc = json.loads(out)
    assert code == 0 and [b["bundle_id"] for b in doc["bundles"]] == [old.name, new.name]
    first, second = doc["bundles"]
    assert doc["series"] == ["i16-c1", "i16-c2"]
    assert first["values"] == {c: m[read_1] for c, m in _cells(old).items()}
    assert second["values"] == {c: m[read_2] for c, m in _cells(new).items()}
    assert all(v is not None for v in second["values"].values())
    renamed, fmt = (read_1, 1) if read_1 != name else (read_2, 2)
    assert doc["notes"] == [f"throughput.{name} is read as throughput.{renamed} in 1 "
                            f"format-{fmt} bundle(s) (the same quantity under that "
                            f"format's name)"]


def test_a_name_that_changed_meaning_says_so(across_formats, capsys):
    evidence, old, new = across_formats
    code, out, _ = _run(["history", FIXTURE_ROW, "--evidence", str(evidence), "--metric",
                         "throughput.ratio_ci_low", "--csv"], capsys)
    rows = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and [r["i16-c1"] for r in rows] == [
        repr(_cells(b)["i16-c1"]["ratio_ci_low"]) for b in (old, new)]
    _, out, _ = _run(["history", FIXTURE_ROW, "--evidence", str(evidence), "--metric",
                      "throughput.ratio_ci_low", "--json"], capsys)
    assert json.loads(out)["notes"] == [
        "throughput.ratio_ci_low means different things across these bundles: output tok/s "
        "(format 1) and the gate's own metric (format 2); "
        "throughput.output_throughput_ratio_ci_low is the output tok/s one in both"]
    code, _, err = _run(["history", FIXTURE_ROW, "--evidence", str(evidence), "--metric",
                         "throughput.ratoi"], capsys)
    assert code == 2 and "did you mean throughput.ratio?" in err
