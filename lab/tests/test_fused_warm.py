"""lab/benchmarks/fused_warm.py: the row's throughput baseline compiled and timed at every
cell of its workload, best of N compiles each in its own process and cache. On a CPU the
graph-fused step runs eagerly (no compile, no cache to keep), so what is checked is that
every cell runs on the arm the gate would measure, in every compile, the choice of the
fastest compile, where its cache goes, and the refusals."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.gates.engine_rows import tiny_row

LAB = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("fused_warm", LAB / "benchmarks" / "fused_warm.py")
assert _spec is not None and _spec.loader is not None
fused_warm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fused_warm)

FUSED = '''
    [[arms.fallbacks]]
    engine = "lab-graph-fused"
    mode = "graph-fused"

    [[gates]]
    id = "throughput"
    kind = "throughput"
    baseline = "{baseline}"
'''


def _row(tmp_path: Path, baseline: str) -> Path:
    return tiny_row(tmp_path, "FUSED-WARM-TEST", FUSED.format(baseline=baseline),
                    oracle="reference", concurrency="[1, 2]", output_len=4, requests=2)


def test_every_cell_runs_on_the_gates_baseline(tmp_path):
    out = tmp_path / "out"
    assert fused_warm.main([str(_row(tmp_path, "graph-fused")), "--device", "cpu",
                            "--passes", "2", "--out", str(out)]) == 0
    doc = json.loads((out / "fused-warm.json").read_text())
    assert doc["baseline"] == "graph-fused" and set(doc["cells"]) == {"i16-c1", "i16-c2"}
    assert all(0 < c["best_s"] and 0 < c["first_s"] for c in doc["cells"].values())
    assert doc["engine"]["mode"] == "graph-fused"
    assert doc["engine"]["fused_compile"] == "no (CPU: eager)"


def test_best_of_two_compiles_each_in_its_own_process_and_cache(tmp_path):
    out, dest = tmp_path / "out", tmp_path / "torchinductor"
    assert fused_warm.main([str(_row(tmp_path, "graph-fused")), "--device", "cpu",
                            "--passes", "1", "--compiles", "2", "--out", str(out),
                            "--install-to", str(dest)]) == 0
    doc = json.loads((out / "fused-warm.json").read_text())
    caches = [a["cache"] for a in doc["compiles"]]
    assert caches == [str(out / "compiles" / str(i) / "cache") for i in (0, 1)]
    assert doc["chosen"] in (0, 1) and min(a["score"] for a in doc["compiles"]) == \
        doc["compiles"][doc["chosen"]]["score"]
    # nothing compiles on a CPU: no cache to install, and the old one is left alone
    assert doc["installed"].startswith("none") and not dest.exists()


def test_the_chosen_compile_is_fastest_over_the_cells_and_its_cache_installed(tmp_path):
    attempts = [{"cells": {"c1": {"best_s": 1.00}, "c4": {"best_s": 1.40}}},
                {"cells": {"c1": {"best_s": 1.02}, "c4": {"best_s": 1.20}}},
                {"cells": {"c1": {"best_s": 0.99}, "c4": {"best_s": 1.60}}}]
    assert fused_warm.choose(attempts) == 1  # 2 % slower at c1, 14 % faster at c4
    assert attempts[1]["score"] == pytest.approx(((1.02 / 0.99) * 1.0) ** 0.5, abs=1e-4)
    cache, dest = tmp_path / "new", tmp_path / "torchinductor"
    (cache / "fxgraph").mkdir(parents=True)
    (dest / "stale").mkdir(parents=True)
    record = {"compiles": attempts, "chosen": 1}
    assert fused_warm._install(cache, dest, record) == str(dest)
    assert (dest / "fxgraph").is_dir() and not (dest / "stale").exists() and not cache.exists()
    assert json.loads((dest / "fused-warm.json").read_text())["chosen"] == 1


def test_the_engine_description_names_the_chosen_compile(tmp_path, monkeypatch):
    from rowgate_lab.engines.fused import compile_cache_note

    assert compile_cache_note(False) == "none (not compiled)"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    drawn = compile_cache_note(True)
    assert drawn.startswith(f"{tmp_path}: ") and drawn.endswith("one compile, as drawn)")
    attempts = [{"cells": {"c1": {"best_s": 1.1}}}, {"cells": {"c1": {"best_s": 1.0}}}]
    fused_warm.choose(attempts)
    (tmp_path / "fused-warm.json").write_text(json.dumps({"compiles": attempts, "chosen": 1}))
    assert compile_cache_note(True).endswith(
        "the cache of compile 1, the fastest of 2 (lab/benchmarks/fused_warm.py; scores 1.100, 1.000)")


def test_a_row_without_a_whole_matrix_throughput_gate_is_refused(tmp_path):
    path = _row(tmp_path, "graph-fused")
    path.write_text(path.read_text().replace('kind = "throughput"',
                                             'kind = "throughput"\ncells = ["i16-c1"]'))
    with pytest.raises(SystemExit, match="no throughput gate over the whole matrix"):
        fused_warm.main([str(path), "--device", "cpu", "--out", str(tmp_path / "o")])


def test_an_unknown_baseline_is_one_line_and_exit_1(tmp_path, capsys):
    assert fused_warm.main([str(_row(tmp_path, "nowhere")), "--device", "cpu",
                            "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("fused_warm: ") and "nowhere" in err and len(err.splitlines()) == 1


def test_a_time_budget_starts_no_compile_that_would_end_past_it(tmp_path):
    out = tmp_path / "out"
    assert fused_warm.main([str(_row(tmp_path, "graph-fused")), "--device", "cpu",
                            "--passes", "1", "--compiles", "3", "--budget-s", "0.01",
                            "--out", str(out), "--install-to", str(tmp_path / "c")]) == 0
    doc = json.loads((out / "fused-warm.json").read_text())
    assert (doc["compiles_asked"], len(doc["compiles"]), doc["chosen"]) == (3, 1, 0)


def test_an_option_that_is_not_key_value_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        fused_warm.main([str(_row(tmp_path, "graph-fused")), "--option", "nvcc",
                         "--out", str(tmp_path / "o")])
    assert exc.value.code == 2 and "--option nvcc: not KEY=VALUE" in capsys.readouterr().err
