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
