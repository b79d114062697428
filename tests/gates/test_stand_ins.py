"""Every seed row's kernel gates with their device requirement satisfied by a stand-in
(an inventory holding a GPU record of the row's target arch), on rowgate's own tree as
`rowgate gate ROW --repo .` gates it: the device requirement is met, the row's build
gate builds the target arch, and everything the operator and phase gates resolve before
they launch resolves — the operator and each entry point the row's cases need in the
build gate's cubin for that arch, the phase variants built through the build recipe for
that arch with the entry points of the row's shape. What is left is the hardware: no
gate is PENDING where it would certainly ERROR. (Engine gates need their arms' servers
and weights, not only a GPU: the engine gates gate those.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from rowgate import gates
from rowgate.cli.progress import PlainProgress
from rowgate.gates import _phase_measure, operator, phase
from rowgate.gates.build import build_into, gate_arches
from rowgate.records.provenance import Gpu
from rowgate.rows.row import all_rows
from rowgate.seal.device import Inventory
from tests.support import LAB

pytestmark = pytest.mark.slow

QUIET = PlainProgress(quiet=True)
KERNEL_GATES = ("operator", "phase")
CASES = [(loaded.row, spec) for loaded in all_rows() for spec in loaded.row.gates
         if spec.kind in KERNEL_GATES]


def stand_in(arch: str) -> Gpu:
    return Gpu(index=0, name=f"stand-in {arch}", arch=arch, uuid="GPU-stand-in", driver="",
               memory_total_mib=0, sm_clock_mhz=0, mem_clock_mhz=0, max_sm_clock_mhz=0,
               temperature_c=0)


def test_the_seed_rows_have_kernel_gates():
    assert {(row.id, spec.kind) for row, spec in CASES} >= {
        ("SM70-XQA-E5M2-DECODE", "operator"), ("SM70-XQA-E5M2-DECODE", "phase")}


@pytest.fixture(scope="module")
def built(tmp_path_factory, build_cache):
    """The row's build gate run on rowgate's tree, once per row: {row id: artifacts root}."""
    done: dict[str, Path] = {}

    def build(row) -> Path:
        if row.id not in done:
            root = tmp_path_factory.mktemp(row.id.lower())
            spec = next(g for g in row.gates if g.kind == "build")
            with pytest.MonkeyPatch.context() as mp:
                mp.setenv("ROWGATE_CACHE_DIR", str(build_cache))
                build_into(LAB, gate_arches(row, spec.arches), spec.kernels, {},
                           root / spec.id, QUIET)
            done[row.id] = root
        return done[row.id]
    return build


@pytest.mark.parametrize("row,spec", CASES, ids=[f"{r.id}-{s.id}" for r, s in CASES])
def test_nothing_but_the_hardware_is_missing(row, spec, built, tmp_path):
    arch = row.target.arch
    choice = Inventory((stand_in(arch),)).select(arch, row.target.device,
                                                 row.target.stand_in_arches)
    assert choice.gpu is not None and not choice.stand_in
    assert gates.device_requirement(row, spec, choice) is None
    root = built(row)
    if spec.kind == "operator":
        op, cubin, _ = operator.resolve(row, spec, root, arch)
        assert cubin.arch == arch and op.name == (spec.operator or op.name)
    else:
        name, decl, op, case, variants, entries = phase.resolve(row, spec, root)
        builds = _phase_measure.build_variants(LAB, decl.kernel, arch, variants, None,
                                               tmp_path, QUIET)
        assert all(not b["problems"] for b in builds.values()), \
            {v: b["problems"][:1] for v, b in builds.items() if b["problems"]}
        phase.check_entries(builds, entries, spec.shape)
