"""cudabuild.cubin: what loaders call. Real compiles (slow), fixtures from tests/."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from rowgate.cuda import cudabuild, kernels

pytestmark = pytest.mark.slow
FIXTURES = Path(__file__).parents[1] / "fixtures" / "kernels"


def _repo(root: Path, source: str, entry: str) -> Path:
    (root / "kernels" / "include").mkdir(parents=True)
    shutil.copyfile(FIXTURES / source, root / "kernels" / source)
    (root / "kernels" / "kernels.toml").write_text(textwrap.dedent(f'''
        version = 1
        [kernels.k]
        source = "{source}"
        entry_points = ["{entry}"]
        arches = ["sm_70", "sm_90"]
    '''))
    return root


def test_cubin_of_a_clean_kernel_is_built_once(tmp_path):
    repo = _repo(tmp_path, "clean.cu", "scale")
    first = cudabuild.cubin(repo, "k", "sm_90")
    assert first.name == "k.sm_90.cubin" and first.stat().st_size > 0
    assert cudabuild.cubin(repo, "k", "sm_90") == first  # served from the cache


def test_cubin_refuses_a_build_with_a_warning(tmp_path):
    repo = _repo(tmp_path, "warn_device.cu", "warn_device")
    with pytest.raises(cudabuild.BuildFailed, match='k sm_70: nvrtc exited 0: .*#177-D'):
        cudabuild.cubin(repo, "k", "sm_70")


def test_cubin_refuses_an_arch_the_kernel_does_not_list(tmp_path):
    repo = _repo(tmp_path, "clean.cu", "scale")
    with pytest.raises(kernels.KernelsError, match="does not target sm_110"):
        cudabuild.cubin(repo, "k", "sm_110")


BUILD_IN_A_PROCESS = """
import json, sys, time
from pathlib import Path
from rowgate.cuda import cudabuild, kernels, toolchains
repo, go = Path(sys.argv[1]), Path(sys.argv[2])
manifest = kernels.load(repo)
chain = toolchains.for_arch("sm_90")
print("ready", flush=True)
while not go.exists():  # both start compiling at once
    time.sleep(0.01)
built = cudabuild.build(repo, manifest, "k", "sm_90", chain)
print(json.dumps({"path": str(built.path), "cached": built.cached}))
"""


def test_two_processes_building_the_same_kernel_compile_it_once(tmp_path):
    import json
    import os
    import subprocess
    import sys

    repo = _repo(tmp_path / "subject", "clean.cu", "scale")
    env = dict(os.environ, ROWGATE_CACHE_DIR=str(tmp_path / "cache"))
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", BUILD_IN_A_PROCESS, str(repo), str(go)],
                              env=env, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    go.write_text("")
    done = [json.loads(p.communicate(timeout=300)[0]) for p in procs]
    assert done[0]["path"] == done[1]["path"]
    # one compiled, the other waited for it and reused it (never two compiles side by side)
    assert sorted(d["cached"] for d in done) == [False, True]
    assert len(list((tmp_path / "cache" / "kernels" / "k" / "sm_90").glob(".*-*"))) == 0
