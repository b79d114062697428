"""The bundle report: model from real sealed bundles, HTML / Markdown, and a real browser.

Two kinds of bundle are used. `sealed` (conftest) is a real host-gate run
through `runner.run_row`. `rich` is sealed and signed by the real `Stage`
with results of the GPU gate kinds (throughput, trace, audit, tokens,
operator) written in the shapes those gates produce: the gates themselves
need GPUs and vLLM, and the report only reads results, so its sections are
tested on results whose numbers the test knows. The throughput cells come
from `rowgate.stats.paired.compare` on seeded samples, the token divergences from
the tokens gate's own `compare_request`.
"""

from __future__ import annotations

import base64
import gzip
import io
import json
import os
import shutil
import subprocess
import textwrap
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from rowgate import report
from rowgate.records.gate_result import GateResult
from rowgate.records.status import Status
from rowgate.report import html, markdown, plots
from rowgate.report.model import BarFigure, ImageFigure, IntervalFigure, TimelineFigure
from rowgate.rows import row as rows
from rowgate.run import provenance
from rowgate.seal import signing
from rowgate.seal.bundle import Bundle, Stage
from rowgate.stats import paired as stats
from tests.support import thaw, write_row

CELLS = ["i16-c1", "i16-c4", "i1024-c1", "i1024-c4"]
FIGURES = 4
"""Plots of the rich bundle: throughput ratios with CIs, idle breakdown, trace timeline,
and the PNG the audit gate sealed."""

RICH_GATES = '''
    [[gates]]
    id = "audit"
    kind = "audit"

    [[gates]]
    id = "tokens"
    kind = "tokens"

    [[gates]]
    id = "throughput"
    kind = "throughput"
    min_effect = 0.03

    [[gates]]
    id = "trace"
    kind = "trace"

    [[gates]]
    id = "operator"
    kind = "operator"
    baseline = "split_kv"
    candidate = "split_kv_pipelined"

    [[pending]]
    gate = "operator"
    reason = "no sm_110 device on this host"
    until = "a Thor runner executes the gate"
'''


def _rich_row(tmp_path: Path) -> Path:
    path = write_row(tmp_path, "TEST-RICH", RICH_GATES)
    text = path.read_text().replace("input_lens = [16]", "input_lens = [16, 1024]")
    path.write_text(text.replace("concurrency = [1]", "concurrency = [1, 4]"))
    return path


def _throughput() -> GateResult:
    rng = np.random.default_rng(7)
    cells = {}
    for i, cell in enumerate(CELLS):
        oracle = rng.normal(100.0, 1.0, 9)
        candidate = rng.normal(100.0 * (0.97 + 0.02 * i), 1.0, 9)
        cmp = stats.compare(candidate.tolist(), oracle.tolist(), n_resamples=2000)
        m = cmp.metrics()
        cells[cell] = {"tok_s_median_candidate": m.pop("median_candidate"),
                       "tok_s_median_oracle": m.pop("median_oracle"), **m,
                       "verdict": stats.verdict(cmp, min_effect=0.02, alpha=0.05).value}
    return GateResult(gate_id="throughput", kind="throughput", status=Status.FAIL,
                      reason="1 cell(s) worse", metrics={"cells": 4},
                      cells=cells, arch="sm_90")


def _chrome_trace(path: Path) -> int:
    """A Kineto-format trace: two streams of kernels plus CPU ops; returns #kernels."""
    events = [{"ph": "M", "name": "thread_name", "pid": 0, "tid": 7,
               "args": {"name": "stream 7"}}]
    kernels = 0
    for step in range(4):
        t = 1000.0 + step * 300.0
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1,
                       "ts": t - 20, "dur": 15})
        for k, (name, dur) in enumerate([("gemm", 80.0), ("attention", 60.0), ("norm", 10.0)]):
            events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7 + k % 2,
                           "ts": t + k * 90.0, "dur": dur})
            kernels += 1
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    return kernels


def _tokens_outputs(out: Path) -> None:
    def rec(rid: str, cell: str, ids: list[int]) -> str:
        return json.dumps({"id": rid, "cell": cell, "token_ids": ids,
                           "logprobs": [-0.5 - 0.01 * i for i in range(len(ids))]}) + "\n"

    (out / "oracle.jsonl").write_text(rec("r0", "i16-c1", [5, 6, 7, 8])
                                      + rec("r1", "i16-c4", [1, 2, 3, 4]))
    (out / "candidate.jsonl").write_text(rec("r0", "i16-c1", [5, 6, 7, 8])
                                         + rec("r1", "i16-c4", [1, 2, 9, 4]))


def _seal_rich(tmp_path: Path, repo: Path, key: Path) -> Path:
    loaded = rows.load_row(_rich_row(tmp_path))
    stage = Stage(tmp_path / "evidence", loaded.row.id)

    def add(result: GateResult) -> None:
        artifacts = sorted(str(p.relative_to(stage.root)) for p in
                           stage.artifact_dir(result.gate_id).rglob("*") if p.is_file())
        stage.add_result(result.model_copy(update={"artifacts": artifacts}))

    for gate in ("audit", "tokens", "throughput", "trace", "operator"):
        stage.artifact_dir(gate).mkdir(parents=True)
    (stage.artifact_dir("audit") / "registers.png").write_bytes(
        plots.render(BarFigure("registers per kernel", "registers", ("split_kv",), (128.0,))))
    add(GateResult(gate_id="audit", kind="audit", status=Status.PASS, reason="within budgets",
                   cells={"split_kv@sm_90": {"registers": 128, "spill_stores": 0, "stack": 0},
                          "split_kv@sm_70": {"registers": 96, "spill_stores": 0, "stack": 16}}))
    _tokens_outputs(stage.artifact_dir("tokens"))
    add(GateResult(gate_id="tokens", kind="tokens", status=Status.FAIL,
                   reason="1 of 2 requests differ | first at r1 position 2",
                   metrics={"requests": 2, "mismatched_requests": 1}))
    add(_throughput())
    _chrome_trace(stage.artifact_dir("trace") / "trace.json.gz")
    add(GateResult(gate_id="trace", kind="trace", status=Status.PASS, reason="one range",
                   metrics={"ranges": 1, "idle_launch_gap": 0.18, "idle_tail": 0.07,
                            "idle_recoverable": 0.21}))
    add(GateResult(gate_id="operator", kind="operator", status=Status.PENDING,
                   reason="no sm_110 GPU here (NVML sees none)"))
    return stage.seal(row=loaded, row_file=str(loaded.path), subject=provenance.subject(repo),
                      provenance=provenance.collect(), signer=signing.KeySigner(key),
                      order=[g.id for g in loaded.row.gates])


@pytest.fixture
def rich(tmp_path, git_repo, make_key) -> tuple[Path, Path]:
    """(bundle, public key) of a sealed multi-kind bundle."""
    key = make_key()
    bundle = _seal_rich(tmp_path, Path(git_repo.working_dir), key)
    return bundle, signing.KeySigner(key).public_key_file()


# ---------------------------------------------------------------------- model


def test_model_from_a_real_host_bundle(sealed, tmp_path):
    bundle, signer = sealed
    page = report.report_for(bundle, reviews_dir=tmp_path / "reviews")
    assert page.verification.implicit and not page.verification.verified  # no key named
    assert signer.identity.id in page.verification.detail
    assert (page.row_id, page.row_title, page.verdict) == ("TEST-HOST", "test row", "PASS")
    assert page.review is None and page.pending == ()
    assert page.gates.rows == (("host", "host", "—", "PASS", "yes", page.sections[0].reason),)
    metrics = dict(page.sections[0].tables[0].rows)
    assert metrics["commands_failed"] == "0"
    assert "matches the gated digest" in page.row_note
    facts = dict(page.facts)
    assert facts["subject"].endswith(Bundle.open(bundle).manifest.subject.commit)


def test_a_tampered_bundle_is_reported_as_not_verified(sealed, tmp_path):
    bundle, _ = sealed
    thaw(bundle)
    (bundle / "artifacts/host/status.txt").write_text("M tampered\n")
    page = report.report_for(bundle, reviews_dir=tmp_path)
    assert not page.verification.verified
    assert "artifacts/host/status.txt" in page.verification.detail
    assert "signature NOT verified" in html.render(page)


def test_a_bundle_signed_by_another_key_does_not_verify(rich, tmp_path, make_key):
    bundle, _ = rich
    other = signing.KeySigner(make_key("other")).public_key_file()
    page = report.report_for(bundle, key=other, reviews_dir=tmp_path)
    assert not page.verification.verified and "expected key" in page.verification.detail


def test_review_record_gives_the_verdict(sealed, tmp_path):
    bundle, _ = sealed
    b = Bundle.open(bundle)
    record = report.review_path(tmp_path / "reviews", b)
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({
        "verdict": "REJECT", "summary": "REJECT: criterion host-clean failed",
        "reasons": ["criterion host-clean failed", "stale: main moved"],
        "reviewer": {"kind": "key", "id": "sha256:abc", "issuer": ""},
        "criteria": [{"id": "host-clean", "gate": "host", "metric": "commands_failed",
                      "measured": {"(gate)": 1}, "outcome": "fail"}],
        "pending": [{"gate": "trace", "reason": "no Thor here", "until": "Thor runner"}]}))
    page = report.report_for(bundle, reviews_dir=tmp_path / "reviews")
    assert page.verdict == "REJECT" and page.status is Status.PASS
    assert page.review.reasons[1] == "stale: main moved"
    crit = page.review.tables[0]
    assert crit.columns[crit.status_column] == "outcome"
    assert crit.rows[0][crit.columns.index("measured")] == "(gate)=1"
    assert ("review", "trace", "no Thor here", "Thor runner") in [
        (p.source, p.gate, p.reason, p.until) for p in page.pending]
    assert page.review.signature == "no signature file beside it"


def test_a_real_review_gives_the_headline_and_its_tables(tmp_path, monkeypatch, capsys):
    from tests.review_support import World

    world = World(tmp_path, monkeypatch, capsys)
    row = world.row()
    bundle = world.gate(row)
    code, _, err = world.review(bundle, row)
    assert code == 0, err
    page = report.report_for(bundle, key=world.gate_pub, reviews_dir=world.reviews)
    assert page.verification.verified and (page.verdict, page.status) == ("APPROVE", Status.PASS)
    assert page.verdict_source.startswith("review ") and page.review.reason.startswith("APPROVE")
    assert page.review.signature == f"{bundle.name}.review.sigstore.json"
    crit = next(t for t in page.review.tables if t.title == "criteria")
    row_ = dict(zip(crit.columns, crit.rows[0]))
    assert (row_["id"], row_["outcome"], row_["measured"]) == ("commands-pass", "pass", "(gate)=0")
    assert "Review: ✅ APPROVE" in markdown.render(page)


def test_unreadable_review_record_is_shown_not_hidden(sealed, tmp_path):
    bundle, _ = sealed
    record = report.review_path(tmp_path, Bundle.open(bundle))
    record.parent.mkdir(parents=True)
    record.write_text("{not json")
    assert report.report_for(bundle, reviews_dir=tmp_path).verdict == "UNREADABLE"


def test_rich_bundle_sections(rich, tmp_path):
    bundle, key = rich
    page = report.report_for(bundle, key=key, reviews_dir=tmp_path)
    assert page.verification.verified and page.verdict == "FAIL"
    sections = {s.gate_id: s for s in page.sections}

    audit = sections["audit"]
    (image,) = audit.figures
    assert isinstance(image, ImageFigure) and image.title == "audit: artifacts/audit/registers.png"
    assert image.png == (bundle / "artifacts/audit/registers.png").read_bytes()
    assert [t.title for t in audit.tables] == ["sm_70: audit per kernel", "sm_90: audit per kernel"]
    assert audit.tables[1].rows == (("split_kv", "128", "0", "0"),)

    tp = sections["throughput"]
    (fig,) = tp.figures
    assert isinstance(fig, IntervalFigure) and fig.labels == tuple(CELLS)
    sealed = Bundle.open(bundle).gate_result("throughput").cells
    assert fig.values == tuple(sealed[c]["ratio_median"] for c in CELLS)
    assert fig.band == pytest.approx((0.97, 1.03))  # the row's min_effect
    ab = next(t for t in tp.tables if t.title.endswith("A/B per cell"))
    assert {"tok_s_median_oracle", "ratio_ci_low", "p_value", "verdict"} <= set(ab.columns)
    assert ab.columns[ab.status_column] == "verdict"

    trace = sections["trace"]
    bars = [f for f in trace.figures if isinstance(f, BarFigure)]
    assert bars[0].labels == ("idle_launch_gap", "idle_recoverable", "idle_tail")  # sealed sorted
    (timeline,) = [f for f in trace.figures if isinstance(f, TimelineFigure)]
    assert len(timeline.spans) == 12  # kernels only: the CPU op is left out
    assert {s.lane for s in timeline.spans} == {"stream 7", "0/8"}
    assert timeline.spans[0].start == 0.0

    (div,) = sections["tokens"].tables[1:]
    assert div.rows == (("r1", "i16-c4", "2", "3", "9", "-0.52", "-0.52", "3/4"),)

    pending = [(p.source, p.gate) for p in page.pending]
    assert pending == [("gate", "operator"), ("row", "operator")]


def test_a_trace_gate_with_its_own_plots_shows_those_instead(tmp_path):
    from rowgate.report.sections import section_for

    (tmp_path / "artifacts/trace").mkdir(parents=True)
    png = plots.render(BarFigure("idle", "fraction", ("gap",), (0.2,)))
    (tmp_path / "artifacts/trace/idle-breakdown.png").write_bytes(png)
    (tmp_path / "artifacts/trace/not-a.png").write_bytes(b"GIF89a")
    # model_construct: a sealed result can no longer name a path outside its artifacts
    # (records.ids.ARTIFACT_PATH); the report's own guard is still checked here
    result = GateResult.model_construct(
        gate_id="trace", kind="trace", status=Status.PASS, reason="r", cells={},
        metrics={"oracle.graph.idle_fraction": 0.2}, arch="", stand_in=False, duration_s=0.0,
        artifacts=["artifacts/trace/idle-breakdown.png", "artifacts/trace/not-a.png",
                   "artifacts/../../outside.png"])
    (figure,) = section_for(result, tmp_path).figures
    assert isinstance(figure, ImageFigure) and figure.png == png


def test_build_cells_per_arch_with_their_status(tmp_path):
    from rowgate.report.sections import section_for

    build = GateResult(gate_id="build", kind="build", status=Status.FAIL, reason="r",
                       cells={"decode@sm_90": {"status": "PASS", "toolchain": "nvcc 13.0"},
                              "decode@sm_70": {"status": "FAIL", "toolchain": "nvrtc 12.8"},
                              "triton-aot@sm_110": {"reachable": False}})
    tables = section_for(build, tmp_path).tables
    assert [t.title for t in tables] == ["sm_70: build per kernel", "sm_90: build per kernel",
                                         "sm_110: build per kernel"]
    sm70 = tables[0]
    assert sm70.rows == (("decode", "FAIL", "nvrtc 12.8"),)
    assert sm70.columns[sm70.status_column] == "status"


def test_names_are_shown_exactly_in_html_and_markdown(tmp_path):
    """A mangled C++ entry point ends in `_`: nothing of a name is trimmed anywhere."""
    from rowgate.report import html, markdown
    from rowgate.report.sections import section_for

    name = "_Z20gelu_forward_kernel2P13__nv_bfloat16PKS_"
    audit = GateResult(gate_id="audit", kind="audit", status=Status.PASS, reason="r",
                       cells={f"k/{name}@sm_90": {"registers": 32, "arch": "sm_90"}})
    (table,) = section_for(audit, tmp_path).tables
    assert table.rows[0][0] == f"k/{name}"
    for render in (html._table, markdown.table):
        assert f"k/{name}" in render(table).replace("\\_", "_")


def test_an_unknown_shape_degrades_to_the_generic_tables(tmp_path):
    from rowgate.report.sections import section_for

    odd = GateResult(gate_id="tp", kind="throughput", status=Status.PASS, reason="r",
                     cells={"i16-c1": {"speedup": 1.2}}, artifacts=["artifacts/tp/x.json"])
    s = section_for(odd, tmp_path)
    assert s.figures == () and [t.title for t in s.tables] == ["cell metrics"]
    phase = GateResult(gate_id="ph", kind="phase", status=Status.PASS, reason="r",
                       metrics={"qk": 0.3}, cells={"B16": {"qk": 0.3, "pv": 0.2}})
    s = section_for(phase, tmp_path)
    assert [t.title for t in s.tables] == ["metrics", "cell metrics"]
    assert s.tables[1].rows == (("B16", "0.3", "0.2"),)


# ------------------------------------------------------------------ rendering


class _Page(HTMLParser):
    """Collects what a self-contained page must (not) have."""

    def __init__(self):
        super().__init__()
        self.tags: list[str] = []
        self.urls: list[str] = []
        self.images: list[str] = []
        self.csp = ""
        self.cells: list[str] = []
        self._in_td = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append(tag)
        self.urls += [v for k, v in attrs if k in ("src", "href", "action") and v]
        if tag == "img":
            self.images.append(a["src"])
        if tag == "meta" and a.get("http-equiv") == "Content-Security-Policy":
            self.csp = a["content"]
        self._in_td = tag == "td"

    def handle_data(self, data):
        if self._in_td:
            self.cells.append(data)


def _parse(text: str) -> _Page:
    page = _Page()
    page.feed(text)
    return page


def test_html_is_self_contained_with_real_pngs(rich, tmp_path):
    import matplotlib.image

    bundle, key = rich
    text = html.render(report.report_for(bundle, key=key, reviews_dir=tmp_path))
    page = _parse(text)
    assert "script" not in page.tags and "link" not in page.tags
    assert page.csp.startswith("default-src 'none'")
    assert all(u.startswith("data:image/png;base64,") for u in page.urls)
    assert len(page.images) == FIGURES
    for src in page.images:
        pixels = matplotlib.image.imread(io.BytesIO(base64.b64decode(src.split(",", 1)[1])),
                                         format="png")
        assert pixels.shape[1] == plots.WIDTH_IN * plots.DPI and pixels.std() > 0
    assert "no sm_110 GPU here (NVML sees none)" in page.cells
    assert "a Thor runner executes the gate" in page.cells


def test_each_figure_kind_renders_a_png():
    figures = [IntervalFigure("t", "y", ("a", "b"), (1.0, 0.9), (0.95, 0.8), (1.05, 0.99)),
               BarFigure("idle", "fraction", ("x",), (0.25,)),
               TimelineFigure("tl", "ms", ())]
    for f in figures:
        assert plots.render(f).startswith(b"\x89PNG\r\n\x1a\n")
    with pytest.raises(TypeError):
        plots.render(object())


def test_markdown_has_the_tables_and_escapes_pipes(rich, tmp_path):
    bundle, key = rich
    md = markdown.render(report.report_for(bundle, key=key, reviews_dir=tmp_path))
    assert "**Verdict: ❌ FAIL** (bundle status (no review record)); signature verified" in md
    assert "| tokens | tokens | — | ❌ FAIL | yes | 1 of 2 requests differ \\| first at r1 position 2 |" in md
    assert "- **operator** (gate): no sm_110 GPU here (NVML sees none)" in md
    assert "_2 plot(s) in the HTML report: trace: idle breakdown; trace: trace.json.gz_" in md
    assert "_1 plot(s) in the HTML report: audit: artifacts/audit/registers.png_" in md


def test_step_summary_is_appended_in_a_runner_job(sealed, tmp_path, monkeypatch, capsys):
    from rowgate.cli.main import main

    bundle, _ = sealed
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    out_html = tmp_path / "out" / "report.html"
    with pytest.raises(SystemExit) as exit_:
        main(["report", str(bundle), "--html", str(out_html), "--reviews", str(tmp_path)])
    assert exit_.value.code == 0
    text = summary.read_text()
    assert text.startswith("earlier step\n## rowgate report: TEST-HOST")
    assert out_html.read_text().startswith("<!DOCTYPE html>")
    err = capsys.readouterr().err
    assert f"rowgate: wrote {out_html}" in err and f"rowgate: wrote {summary}" in err


def test_a_step_summary_over_githubs_limit_is_cut_with_a_note(tmp_path):
    target = tmp_path / "summary.md"
    assert markdown.append_step_summary("x", env={}) is None
    markdown.append_step_summary("é" * markdown.STEP_SUMMARY_LIMIT,
                                 env={markdown.STEP_SUMMARY_ENV: str(target)})
    data = target.read_bytes()
    assert len(data) <= markdown.STEP_SUMMARY_LIMIT
    assert data.decode().endswith("_(cut: the full report is in the uploaded artifact)_\n")


def test_report_without_outputs_prints_markdown_and_quiet_prints_nothing_else(sealed, tmp_path,
                                                                             capsys):
    from rowgate.cli.main import main

    bundle, _ = sealed
    with pytest.raises(SystemExit) as exit_:
        main(["report", str(bundle), "--reviews", str(tmp_path), "-q"])
    assert exit_.value.code == 0
    out, err = capsys.readouterr()
    assert out.startswith("## rowgate report: TEST-HOST") and err == ""


def test_report_of_a_missing_bundle_is_one_line_exit_2(tmp_path, capsys):
    from rowgate.cli.main import main

    with pytest.raises(SystemExit) as exit_:
        main(["report", str(tmp_path / "nope")])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().count("\n") == 0


# ------------------------------------------------------------ real browser

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run",
                  "--run-all-compositor-stages-before-draw", "--virtual-time-budget=5000"]

PROBE = textwrap.dedent("""
    <script>
    window.__errors = [];
    window.addEventListener("error", e => window.__errors.push(String(e.message || e.type)));
    document.addEventListener("securitypolicyviolation",
                              e => window.__errors.push("csp " + e.violatedDirective));
    window.addEventListener("load", () => {
      const imgs = [...document.images].map(i => ({alt: i.alt, complete: i.complete,
                                                    width: i.naturalWidth}));
      const rows = document.querySelectorAll("table tbody tr").length;
      const pre = document.createElement("pre");
      pre.id = "probe";
      pre.textContent = JSON.stringify({imgs, rows, errors: window.__errors});
      document.body.appendChild(pre);
    });
    </script>
""")


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        pytest.skip("Debian's chromium is not installed (nox -s tests installs it when root)")
    return found


def _run_chromium(page: Path, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"
    return subprocess.run([_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *extra,
                           page.as_uri()], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HOME": str(tmp_path)})


def test_headless_chromium_loads_the_page_with_tables_and_images(rich, tmp_path):
    bundle, key = rich
    text = html.render(report.report_for(bundle, key=key, reviews_dir=tmp_path))
    page = tmp_path / "report.html"
    page.write_text(text)

    dom = _run_chromium(page, tmp_path, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    parsed = _parse(dom.stdout)
    assert {"throughput", "trace", "audit", "tokens", "operator"} <= set(parsed.cells)
    assert len(parsed.images) == FIGURES

    # The probe copy differs only by the script and the CSP allowing it (the
    # report itself runs no script): it reports what the browser made of the page.
    probe = tmp_path / "probe.html"
    probe.write_text(text.replace("default-src 'none';", "default-src 'none'; "
                                  "script-src 'unsafe-inline';")
                     .replace("</head>", PROBE + "</head>"))
    run = _run_chromium(probe, tmp_path, "--dump-dom")
    assert run.returncode == 0, run.stderr[-2000:]
    start = run.stdout.index('<pre id="probe">') + len('<pre id="probe">')
    result = json.loads(run.stdout[start:run.stdout.index("</pre>", start)]
                        .replace("&quot;", '"').replace("&amp;", "&"))
    assert result["errors"] == []
    assert len(result["imgs"]) == FIGURES
    assert all(i["complete"] and i["width"] == plots.WIDTH_IN * plots.DPI for i in result["imgs"])
    assert result["rows"] >= len(CELLS) + 5

    shot = tmp_path / "report.png"
    run = _run_chromium(page, tmp_path, f"--screenshot={shot}", "--window-size=1200,2400")
    assert run.returncode == 0 and shot.is_file(), run.stderr[-2000:]
    import matplotlib.image

    pixels = matplotlib.image.imread(shot)
    assert pixels.shape[:2] == (2400, 1200) and pixels.std() > 0.05
    keep = os.environ.get("ROWGATE_KEEP_SCREENSHOT")
    if keep:  # for a person to look at the page: ROWGATE_KEEP_SCREENSHOT=/tmp/report.png
        shutil.copyfile(shot, keep)


def test_the_page_says_what_it_checked_against_and_an_implicit_key_is_no_verification(
        sealed, tmp_path):
    from rowgate.report import html
    from rowgate.seal.signing import local_public_key

    bundle, _ = sealed
    page = report.report_for(bundle, reviews_dir=tmp_path)
    # `rowgate verify` refuses implicit keys: the page never calls this verified
    assert not page.verification.verified and page.verification.implicit
    # the implicit key is the operator's own (ROWGATE_SIGNING_KEY's public half when set,
    # else the local key): the page names the file it checked against
    detail = page.verification.detail
    assert "checked against the implicit local key " in detail
    named_file = detail.split("checked against the implicit local key ", 1)[1].split(" ", 1)[0]
    assert Path(named_file).is_file()
    text = html.render(page)
    assert 'class="verdict implicit" id="signature">signature matches an implicit key only' in text
    assert "signature verified" not in text
    assert "**matches an implicit key only** (not verified)" in markdown.render(page)
    named = report.report_for(bundle, key=local_public_key(), reviews_dir=tmp_path)
    assert named.verification.verified and not named.verification.implicit
    assert "checked against the key " in named.verification.detail
    assert 'class="verdict verified" id="signature">signature verified' in html.render(named)
