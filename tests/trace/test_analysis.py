"""The trace measures: on the real CPU capture, and on GPU-shaped traces whose right
answers are known by construction (occupancy, waves, gap causes, graph route, bytes)."""

from __future__ import annotations

import math
import sys

import pytest

from rowgate.trace import analysis, events, holistic
from rowgate.trace.analysis import blocks_per_sm
from tests.trace import gpu_shaped as gs
from tests.trace import planted

CEILING = 4.3e12  # bytes/s read + written: the H200's measured device copy


def analyse(doc, mode="eager", material=0.10, reference=None):
    return analysis.analyze(events.from_dict(doc), mode, CEILING, material, reference)


# ------------------------------------------------------------ CPU capture


@pytest.fixture(scope="module")
def cpu():
    doc, _, _ = planted.scenario("cpu-eager-delayed")
    return analysis.analyze(events.from_dict(doc), "eager", 9e9, 0.10)


def test_cpu_executing_path_is_the_same_every_step(cpu):
    assert len(cpu.steps) == 4
    assert cpu.path["distinct_paths"] == 1
    first = [w["name"] for w in cpu.path["steps"][0]]
    assert first.count("aten::matmul") >= 8  # 2 layers × q, k, v, o, gate, up, down + head
    assert all(w["grid"] is None for w in cpu.path["steps"][0])


def test_cpu_breakdown_is_host_time_and_says_what_it_cannot_measure(cpu):
    s = cpu.temporal["summary"]
    assert s["busy_fraction"] + s["idle_fraction"] == pytest.approx(1.0)
    assert s["host_fraction"] == pytest.approx(s["idle_fraction"])
    assert 0 < s["idle_fraction"] < 1
    assert cpu.waves == {"supported": False,
                         "why": "no kernels with grids: a CPU trace has no waves"}
    assert cpu.launches["supported"] is False
    assert cpu.graph["supported"] is False and cpu.graph["proved"] is None
    assert cpu.capacity["tail_fraction"] is None


def test_cpu_capacity_parts_add_up(cpu):
    c = cpu.capacity
    assert c["recoverable_idle_fraction"] == pytest.approx(
        c["gap_fraction"] + c["bandwidth_fraction"])
    assert c["gap_fraction"] == pytest.approx(cpu.temporal["summary"]["idle_fraction"])
    assert c["verdict"] == ("material" if c["recoverable_idle_fraction"] >= 0.10
                            else "not material")


def test_cpu_bytes_come_from_recorded_shapes(cpu):
    """The lm_head matmul of the tiny model: [1,128] x [128,1024] float32, once per step."""
    head = [w for w in cpu.items if w.step == 0 and w.name == "aten::matmul"
            and w.bytes == (128 + 128 * 1024 + 1024) * 4]
    assert head, "lm_head matmul bytes not derived from its shapes"


def test_analysis_is_deterministic_from_the_file():
    doc, _, _ = planted.scenario("cpu-eager-delayed")
    a = analysis.analyze(events.from_dict(doc), "eager", 9e9, 0.1).summary()
    b = analysis.analyze(events.from_dict(doc), "eager", 9e9, 0.1).summary()
    assert a == b


def test_hta_says_why_it_does_not_read_a_cpu_trace():
    doc, _, _ = planted.scenario("cpu-eager-delayed")
    out = holistic.breakdown(doc)
    assert out["supported"] is False and "GPU streams" in out["why"]


# ------------------------------------------------------------- occupancy


@pytest.mark.parametrize("threads, regs, smem, expected, limit", [
    (128, 32, 0, 16, "threads: 2048 / 128"),
    (1024, 64, 0, 1, "registers: 64×32 per warp → 32 warps per SM, a block is 32 warps"),
    (256, 255, 0, 1, "registers: 255 → 8192 per warp (256-unit), 8 warps per SM"),
    (128, 32, 100_000, 2, "shared memory: (100000 + 1 KiB) per block into 228 KiB"),
    (32, 16, 0, 32, "resident-block limit of sm_90"),
])
def test_blocks_per_sm(threads, regs, smem, expected, limit):
    assert blocks_per_sm(gs.H200, threads, regs, smem) == expected, limit


# ------------------------------------------------------------------ waves


def test_wave_tails_time_weighted():
    k_full = gs.Kernel("two_full_waves", 20.0, grid=(264, 1, 1), block=(1024, 1, 1),
                       registers=64)  # 1 block/SM: 264 / 132 = exactly 2 waves
    k_tail = gs.Kernel("one_block_over", 20.0, grid=(133, 1, 1), block=(1024, 1, 1),
                       registers=64)  # 2 waves, the second holds 1 of 132 slots
    k_small = gs.Kernel("partial", 10.0, grid=(66, 1, 1), block=(1024, 1, 1), registers=64)
    a = analyse(gs.Builder().doc([[k_full, k_tail, k_small]] * 2), material=0.0)
    by = {w.name: w for w in a.items if w.step == 0}
    assert by["two_full_waves"].waves == 2.0 and by["two_full_waves"].tail_us == 0.0
    assert by["one_block_over"].waves == pytest.approx(133 / 132)
    assert by["one_block_over"].last_wave_unused == pytest.approx(131 / 132)
    assert by["partial"].waves == 0.5 and by["partial"].last_wave_unused == 0.5
    assert a.waves["single_partial_wave_kernels"] == 2
    weighted = (20 * 0 + 20 * 131 / 132 + 10 * 0.5) / 50
    assert a.waves["time_weighted_last_wave_unused"] == pytest.approx(weighted)


# --------------------------------------------------------- temporal / gaps


def test_gap_causes_host_wait_kernel_wait_other():
    ks = [gs.Kernel("a", 10.0), gs.Kernel("b", 10.0, gap_before=2.0),
          gs.Kernel("c", 10.0, gap_before=40.0), gs.Kernel("d", 10.0, gap_before=30.0,
                                                           launch_late=True)]
    a = analyse(gs.Builder().doc([ks]))
    p = a.temporal["per_step"][0]
    assert p["kernel_wait_us"] == pytest.approx(2.0)  # b: queued, short gap
    assert p["other_us"] == pytest.approx(40.0)  # c: queued, long gap
    lead_and_trail = p["host_wait_us"] - 30.0  # d: launched after c ended
    assert lead_and_trail > 0
    assert p["busy_us"] == pytest.approx(40.0)
    assert p["idle_us"] == pytest.approx(p["step_us"] - 40.0)


def test_launch_delays_measured_from_the_launch_call():
    a = analyse(gs.Builder().doc([[gs.Kernel("a", 10.0), gs.Kernel("b", 10.0)]] * 3))
    assert a.launches["supported"] and a.launches["kernels"] == 6
    assert a.launches["launch_calls"] == {"cudaLaunchKernel": 6}
    assert a.launches["launch_delay_us_median"] > 0


# ---------------------------------------------------------- bandwidth


GEMV_BYTES = (2048 + 2048 * 2048 + 2048) * 2  # x, W, y in bf16


def test_bandwidth_from_op_shapes_and_the_shortfall():
    ideal_us = GEMV_BYTES / CEILING * 1e6  # ≈ 1.95 µs
    k = gs.Kernel("gemv", 10.0, grid=(264, 1, 1), block=(1024, 1, 1), registers=64)
    a = analyse(gs.Builder().doc([[k]] * 2))
    w = a.items[0]
    assert w.bytes == GEMV_BYTES
    assert w.achieved_bytes_per_s == pytest.approx(GEMV_BYTES / 10e-6)
    assert w.bandwidth_us == pytest.approx(10.0 - ideal_us)  # full waves: no tail share
    assert a.bandwidth["bandwidth_floor_us_per_step"] == pytest.approx(ideal_us)


def test_tail_share_capped_at_the_time_above_the_bytes_floor():
    k = gs.Kernel("gemv", 3.0, grid=(133, 1, 1), block=(1024, 1, 1), registers=64)
    a = analyse(gs.Builder().doc([[k]]))
    w = a.items[0]
    above = 3.0 - GEMV_BYTES / CEILING * 1e6
    assert w.tail_us == pytest.approx(min(3.0 * (131 / 132) / 2, above))
    assert w.tail_us + w.bandwidth_us == pytest.approx(above)


def test_graph_kernels_take_bytes_from_the_eager_path():
    ks = [gs.Kernel("gemv", 10.0), gs.Kernel("norm", 2.0, dims=[[1, 2048], [2048, 16]])]
    eager = analyse(gs.Builder().doc([ks] * 2))
    ref = analysis.bytes_reference(eager.items)
    graph = analyse(gs.Builder(mode="graph").doc([ks] * 2), "graph", reference=ref)
    assert [w.bytes for w in graph.items] == [w.bytes for w in eager.items]
    other_path = analyse(gs.Builder(mode="graph").doc([[ks[0]]] * 2), "graph", reference=ref)
    assert all(w.bytes is None for w in other_path.items)


# ---------------------------------------------------------- capacity


def test_capacity_shows_loss_between_and_inside_kernels():
    """The orientation case in miniature: eager loses time between kernels, graph replay
    removes the gaps and leaves the loss inside the kernels — both must show."""
    ks = [gs.Kernel("gemv", 10.0, grid=(133, 1, 1), block=(1024, 1, 1), registers=64,
                    gap_before=30.0, launch_late=True) for _ in range(4)]
    eager = analyse(gs.Builder().doc([ks] * 2))
    fast = [gs.Kernel("gemv", 10.0, grid=(133, 1, 1), block=(1024, 1, 1), registers=64,
                      gap_before=0.5) for _ in range(4)]
    graph = analyse(gs.Builder(mode="graph").doc([fast] * 2), "graph",
                    reference=analysis.bytes_reference(eager.items))
    ce, cg = eager.capacity, graph.capacity
    assert ce["gap_fraction"] > cg["gap_fraction"]
    assert cg["inside_kernels_fraction"] > cg["gap_fraction"]
    for c in (ce, cg):
        assert c["recoverable_idle_fraction"] == pytest.approx(
            c["gap_fraction"] + c["tail_fraction"] + c["bandwidth_fraction"])
    assert cg["verdict"] == "material"


def test_verdict_threshold_is_the_rows():
    ks = [gs.Kernel("gemv", 2.0, grid=(264, 1, 1), block=(1024, 1, 1), registers=64,
                    gap_before=0.1)]
    a = analyse(gs.Builder(mode="graph").doc([ks] * 2), "graph", material=1.0)
    assert a.capacity["verdict"] == "not material"


# ---------------------------------------------------------- graph route


def test_graph_route_proved_for_replayed_steps():
    ks = [gs.Kernel("gemv", 10.0), gs.Kernel("norm", 2.0)]
    g = analyse(gs.Builder(mode="graph").doc([ks] * 3), "graph").graph
    assert g["proved"] is True
    assert g["graph_kernels"] == 6 and g["eager_forward_kernels"] == 0
    assert g["steps_replayed"] == g["steps"] == 3


def test_graph_route_refused_for_eager_forward():
    ks = [gs.Kernel("gemv", 10.0), gs.Kernel("norm", 2.0)]
    g = analyse(gs.Builder().doc([ks] * 3)).graph
    assert g["proved"] is False
    assert g["eager_forward_kernels"] == 6 and g["first_eager"] == "gemv"


def test_graph_route_refused_when_one_step_ran_eagerly():
    ks = [gs.Kernel("gemv", 10.0)]
    b = gs.Builder(mode="graph")
    t = b.step(0, gs.T0, ks) + 50
    b.mode = "eager"
    t = b.step(1, t, ks) + 50
    b._x("user_annotation", events.RANGE_MARKER, gs.T0 - 0.5, t - gs.T0)
    doc = {"deviceProperties": [gs.H200], "baseTimeNanoseconds": gs.BASE_NS,
           "traceEvents": b.events}
    g = analyse(doc, "graph").graph
    assert g["proved"] is False and g["steps_replayed"] == 1


# ----------------------------------------------------------------- HTA


def test_a_gpu_trace_without_hta_installed_says_so_in_the_reviewer_file(monkeypatch):
    # a GPU image without the `trace` extra (the lent H100's) traced a GPU run and
    # crashed writing the reviewer files; HTA is a second opinion, so it is recorded absent
    monkeypatch.setitem(sys.modules, "hta.trace_analysis", None)  # import raises ImportError
    ks = [gs.Kernel("gemv", 10.0), gs.Kernel("norm", 2.0, gap_before=20.0)]
    out = holistic.breakdown(gs.Builder().doc([ks] * 3))
    assert out["supported"] is False
    assert out["why"].startswith("HTA is not installed here (")
    assert out["why"].endswith("pip install 'rowgate[trace]'")


def test_an_hta_that_does_not_load_is_recorded_not_raised(monkeypatch):
    """HTA importing against a pandas or numpy it was not built for raises other errors
    than ImportError (a binary-incompatibility ValueError); the trace gate goes on."""
    class Broken:
        def __getattr__(self, name: str) -> object:
            raise ValueError("numpy.dtype size changed, may indicate binary incompatibility")

    monkeypatch.setitem(sys.modules, "hta.trace_analysis", Broken())
    ks = [gs.Kernel("gemv", 10.0), gs.Kernel("norm", 2.0, gap_before=20.0)]
    out = holistic.breakdown(gs.Builder().doc([ks] * 3))
    assert out == {"supported": False, "why": "HTA did not load here: ValueError: "
                   "numpy.dtype size changed, may indicate binary incompatibility"}


def test_hta_reads_a_gpu_trace():
    ks = [gs.Kernel("gemv", 10.0), gs.Kernel("norm", 2.0, gap_before=20.0)]
    out = holistic.breakdown(gs.Builder().doc([ks] * 3))
    assert out["supported"] and out["hta_version"] == "0.5.0"
    temporal = out["temporal"][0]
    assert temporal["rank"] == 0
    idle_pct = temporal["idle_time_pctg"]
    assert 0 < idle_pct < 100 and not math.isnan(idle_pct)
    cats = {r["idle_category"] for r in out["idle"]}
    assert cats <= {"host_wait", "kernel_wait", "other"} and cats


def test_an_op_with_two_kernels_counts_its_bytes_once():
    """Split-K GEMV: the GEMM kernel and its reduce share one op's bytes."""
    k = gs.Kernel("gemv_splitk", 10.0, split=2.0)
    a = analyse(gs.Builder().doc([[k]]))
    by = {w.name: w for w in a.items}
    assert by["gemv_splitk"].bytes == GEMV_BYTES
    assert by["gemv_splitk_reduce"].bytes is None
    assert a.bandwidth["bytes_per_step"] == GEMV_BYTES


def test_graph_path_unlike_the_eager_one_falls_back_to_step_bytes():
    """Capacity inside kernels must still show after graph replay when the replayed
    kernels cannot be matched one to one with the eager forward."""
    eager = analyse(gs.Builder().doc([[gs.Kernel("gemv", 10.0), gs.Kernel("gemv", 10.0)]] * 2))
    ref = analysis.bytes_reference(eager.items)
    fused = [gs.Kernel("fused_gemv", 20.0, grid=(264, 1, 1), block=(1024, 1, 1), registers=64,
                       gap_before=0.5)]
    g = analyse(gs.Builder(mode="graph").doc([fused] * 2), "graph", reference=ref)
    assert all(w.bytes is None for w in g.items)
    assert g.bandwidth["method"] == "per step, bytes of the eager forward"
    floor = 2 * GEMV_BYTES / CEILING * 1e6
    assert g.bandwidth["step_shortfall_us"] == pytest.approx(2 * (20.0 - floor))
    total = sum(p["step_us"] for p in g.temporal["per_step"])
    assert g.capacity["bandwidth_fraction"] == pytest.approx(2 * (20.0 - floor) / total)


# ------------------------------------------- real GPU captures, when checked in


GPU_DELAYED = [n for n in planted.scenarios() if n.startswith("gpu-") and n.endswith("-delayed")]


@pytest.mark.parametrize("name", GPU_DELAYED)
def test_real_gpu_capture_supports_every_measure(name):
    """H200 captures from `benchmarks/trace_capture.py --device cuda` (checked in by the
    integrator): kernel records carry what waves need, the graph capture proves its
    route and the eager one does not, and HTA reads them."""
    doc, _, record = planted.scenario(name)
    a = analysis.analyze(events.from_dict(doc), record["mode"], CEILING, 0.10)
    assert a.waves["supported"] and a.waves["kernels"] > 0
    assert a.launches["supported"] and a.launches["kernels"] > 0
    names = {tuple(w["name"] for w in step) for step in a.path["steps"]}
    assert len(names) == 1  # grids may change as the block table grows; the kernels do not
    assert a.graph["proved"] is (record["mode"] == "graph")
    assert a.capacity["tail_fraction"] is not None
    hta = holistic.breakdown(doc)
    if record["mode"] == "graph":
        assert hta["supported"] is True
    else:
        # HTA 0.5.0's temporal breakdown asserts `non_compute_time >= 0` on the H200
        # eager capture (seen 2026-11-29): a second opinion that failed is recorded,
        # never raised, and rowgate's own breakdown stands.
        assert hta["supported"] is True or hta["why"].startswith("HTA failed on this trace")


def test_reviewer_pictures_of_gpu_captures(tmp_path):
    from rowgate.trace import plots

    ks = [gs.Kernel("gemv", 10.0, launch_late=True, gap_before=20.0), gs.Kernel("norm", 2.0)]
    eager = analyse(gs.Builder().doc([ks] * 3))
    graph = analyse(gs.Builder(mode="graph").doc([ks] * 3), "graph")
    plots.timeline(graph, "graph", tmp_path / "timeline.png")
    plots.idle_breakdown({"eager": eager, "graph": graph}, tmp_path / "idle.png")
    for name in ("timeline.png", "idle.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_timeline_draws_every_item_of_its_steps_once_at_its_offset():
    """One collection per step and colour, and still every item of the shown steps at its
    offset from its own step's start; items of later steps are not drawn."""
    from rowgate.trace import plots

    ks = [gs.Kernel("gemv", 10.0, gap_before=20.0), gs.Kernel("norm", 2.0),
          gs.Kernel("gemv", 7.0)]
    a = analyse(gs.Builder(mode="graph").doc([ks] * 6), "graph")
    spans = plots.timeline_spans(a, max_steps=4)
    assert {row for row, _ in spans} == {0, 1, 2, 3}
    for row in range(4):
        step = a.steps[row]
        mine = sorted(((w.ts - step.ts) / 1e3, max(w.dur / 1e3, 1e-4))
                      for w in a.items if w.step == row)
        drawn = sorted(x for (r, _), xs in spans.items() if r == row for x in xs)
        assert drawn == mine and len(drawn) >= len(ks)
    assert all(x >= 0 for xs in spans.values() for x, _ in xs)


def test_persistent_step_kernels_are_the_model_and_not_a_graph_route():
    """The megakernel mode: the cubin cuda.core launches (driver API) inside the step call
    is the forward; torch's staging fill beside it is not; no graph route is claimed."""
    eager = analyse(gs.Builder().doc([[gs.Kernel("gemv", 10.0), gs.Kernel("gemv", 10.0)]] * 2))
    mk = [gs.Kernel("decode_megakernel", 12.0, grid=(264, 1, 1), block=(256, 1, 1),
                    registers=128, gap_before=0.0)]  # 2 blocks/SM × 132 SMs: one full wave
    p = analyse(gs.Builder(mode="persistent").doc([mk] * 2), "persistent",
                reference=analysis.bytes_reference(eager.items))
    origins = {w.name: w.origin for w in p.items}
    assert origins == {"fill_staging": "staging", "decode_megakernel": "persistent"}
    assert p.graph["proved"] is False and p.graph["persistent_kernels"] == 2
    assert p.bandwidth["method"] == "per step, bytes of the eager forward"
    floor = 2 * GEMV_BYTES / CEILING * 1e6
    assert p.bandwidth["step_shortfall_us"] == pytest.approx(2 * max(0.0, 12.0 - floor))
