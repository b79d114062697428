"""The declarations docs/examples/vllm-paged-attention/ gives a vLLM checkout (kernel
table, harness/1 harness, row), copied as docs/contracts.md says into a real git
repository and planned by the installed `rowgate`: everything loads and checks, and on
this machine, whose torch is a CPU build, the build's one refusal is that torch."""

from __future__ import annotations

import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import git

EXAMPLE = Path(__file__).resolve().parent.parent / "docs" / "examples" / "vllm-paged-attention"
ROW = "VLLM-PAGED-ATTENTION-SM90"


def _checkout(root: Path) -> Path:
    (root / "kernels").mkdir(parents=True)
    (root / "rows").mkdir()
    shutil.copyfile(EXAMPLE / "kernels.toml", root / "kernels" / "kernels.toml")
    shutil.copyfile(EXAMPLE / "rowgate_harness.py", root / "rowgate_harness.py")
    shutil.copyfile(EXAMPLE / f"{ROW}.toml", root / "rows" / f"{ROW}.toml")
    # closed on the way out: GitPython's `git cat-file` helpers would outlive the test
    with git.Repo.init(root, initial_branch="main") as repo:
        repo.index.add(["kernels/kernels.toml", "rowgate_harness.py", f"rows/{ROW}.toml"])
        repo.index.commit("rowgate declarations\n\nSigned-off-by: t <t@example.com>",
                          author=git.Actor("t", "t@example.com"))
    return root


def test_the_vllm_example_plans_and_names_a_cpu_torch(tmp_path):
    repo = _checkout(tmp_path / "vllm")
    # as docs/contracts.md runs it: in the checkout, its rows/ the row's home
    done = subprocess.run([sys.executable, "-m", "rowgate.cli.main", "gate", ROW, "--repo",
                           ".", "--plan"], capture_output=True, text=True, timeout=120,
                          cwd=repo)
    assert done.returncode == 2, done.stdout + done.stderr  # a plan ERROR
    out = done.stdout
    assert "operator [operator]" in out and "harness/1" in out
    # the row's grid, counted as the gate will make it: batch 1 has no ragged case
    assert "work: 64 randomized-page case(s)" in out
    assert "makes no case of batch 1: a ragged layout needs two or more sequences" in out
    refusal = (f"sm_90: paged_attention: headers: torch {metadata.version('torch')} is a CPU "
               f"build (no c10/cuda/impl/cuda_cmake_macros.h)")
    assert refusal in out
    errors = [line for line in out.splitlines() if "ERROR" in line]
    assert errors == ["row VLLM-PAGED-ATTENTION-SM90: plan ERROR",
                      "build [build]: ERROR on the host", "audit [audit]: ERROR on the host"]
    assert "Traceback" not in done.stderr


PLAN_WITHOUT_TORCH = """
import sys
sys.modules["torch"] = None  # what Python does with a torch that fails to import
from rowgate.cli.main import main
sys.argv = ["rowgate", "gate", "VLLM-PAGED-ATTENTION-SM90", "--repo", ".", "--plan"]
raise SystemExit(main())
"""


def test_a_torch_that_does_not_import_is_one_line_not_a_traceback(tmp_path):
    repo = _checkout(tmp_path / "vllm")
    done = subprocess.run([sys.executable, "-c", PLAN_WITHOUT_TORCH], capture_output=True,
                          text=True, timeout=120, cwd=repo)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert ("rowgate: VLLM-PAGED-ATTENTION-SM90 gate operator: operator gate: torch does not "
            "import here (import of torch halted; None in sys.modules)") in done.stderr
