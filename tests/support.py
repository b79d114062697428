"""Plain helpers shared by tests (fixtures live in conftest.py)."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import git

from rowgate import dirs

REPO = Path(__file__).resolve().parents[1]
"""The rowgate checkout the tests run from (the package under test is the installed wheel)."""
ROWS = REPO / "rows"
"""The campaign's rows."""
DEMOS = dirs.demos_dir()
"""The built-in demo rows, as installed."""
LAB = REPO / "lab"
"""rowgate's lab: a subject in this repository."""

SIGNOFF = "\n\nSigned-off-by: Test Author <author@example.com>\n"


def commit_file(repo: git.Repo, name: str, content: str, message: str, signoff: bool = True) -> git.Commit:
    path = Path(repo.working_dir) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    repo.index.add([name])
    return repo.index.commit(message + (SIGNOFF if signoff else "\n"))


def write_row(directory: Path, row_id: str, body: str, *, arch: str = "cpu", kind: str = "demo",
              target_extra: str = "", engines: bool = True) -> Path:
    """A row file `directory/ROW_ID.toml` with a standard header and the given body
    (`engines=False`: no [arms] and no [workload], a kernel-only row)."""
    header = f'''
        id = "{row_id}"
        title = "test row"
        kind = "{kind}"

        [target]
        arch = "{arch}"
        {target_extra}
    ''' + ('''
        [arms.oracle]
        engine = "vllm"
        version = "0.32.0"

        [arms.candidate]
        engine = "reference"

        [workload]
        input_lens = [16]
        concurrency = [1]
        output_len = 4
    ''' if engines else "")
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{row_id}.toml"
    path.write_text(textwrap.dedent(header) + textwrap.dedent(body))
    return path


BUILD_AUDIT_GATES = '''
    [[gates]]
    id = "build"
    kind = "build"

    [[gates]]
    id = "audit"
    kind = "audit"
'''
"""A build gate and an audit gate of the row's build arches."""
HOST_GATE = '''
    [[gates]]
    id = "host"
    kind = "host"
    commands = [["python", "-c", "print('ok')"]]
'''


def thaw(path: Path) -> None:
    """Make a sealed bundle writable again so a test can tamper with it."""
    for dirpath, _, filenames in os.walk(path):
        os.chmod(dirpath, 0o755)
        for f in filenames:
            p = Path(dirpath) / f
            if not p.is_symlink():
                os.chmod(p, 0o644)


def killed_nvcc(directory: Path) -> Path:
    """An nvcc that answers `--version` as the real one and SIGKILLs itself on a compile:
    a compile killed by a signal (Ctrl-C reaching it, the OOM killer)."""
    from rowgate.cuda import toolchains

    real = toolchains.for_arch("sm_90", None).compiler.path
    nvcc = directory / "nvcc"
    nvcc.parent.mkdir(parents=True, exist_ok=True)
    nvcc.write_text(f'#!/bin/sh\n[ "$1" = --version ] && exec "{real}" "$@"\nkill -9 $$\n')
    nvcc.chmod(0o755)
    return nvcc
