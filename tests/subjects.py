"""External subjects for tests: real repositories, made in temp dirs from the files
under tests/fixtures/subjects/ (projects that are not rowgate, with their own
kernels and kernels.toml), with DCO-signed commits."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import git

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "subjects"
PAGED_DECODE = FIXTURES / "paged_decode"
AUTHOR = ("Ada Kernel", "ada@pagedmini.dev")
SIGNOFF = f"\n\nSigned-off-by: {AUTHOR[0]} <{AUTHOR[1]}>\n"
CANDIDATE_SOURCE = "kernels/attn/paged_decode.cu"
LAST_PAGE_BUG = ("  return len - ((n_pages - 1) << page_shift);\n",
                 "  return len & ((1 << page_shift) - 1);\n")
"""The candidate's row count of a sequence's last page, then the planted bug: a
"simplification" that is 0 instead of a whole page when the length is a multiple
of the page size (an off-by-one in the last page: boundary contexts catch it)."""
BUG_BRANCH = "last-page"
HOSTILE_WRITE = (
    "    decode<T, D, G, PF>(a);" + " " * 65 + "\\\n",
    "    decode<T, D, G, PF>(a);" + " " * 65 + "\\\n"
    "    if (PF && threadIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0) {" + " " * 20 + "\\\n"
    "      const_cast<pm::u8*>(k_cache)[0] ^= 0x5a;" + " " * 47 + "\\\n"
    "      out[-1] = 0x1234;" + " " * 70 + "\\\n"
    "    }" + " " * 85 + "\\\n")
"""The candidate's entry point after its work, then a hostile one: it also flips a byte
of the K cache (an input) and writes the element before its output (the guard band)."""
HOSTILE_BRANCH = "scratch"
SIGNOFF_DEVICE = "\n\nSigned-off-by: rowgate-device <device@rowgate.dev>\n"


def _commit(repo: git.Repo, message: str) -> git.Commit:
    repo.git.add(A=True)
    return repo.index.commit(message + SIGNOFF)


KERNELS_BRANCH = "paged-decode"


def _project(fixture: Path, root: Path, name: str, work: str, *, branch: str,
             change: tuple[str, tuple[str, str], str, str] | None = None) -> git.Repo:
    """`fixture` as its own repository at `root` (which must not exist), shaped like a
    pull request: `main` holds the project's README; without `change`, branch `branch`
    adds the rest in one signed-off commit (`work`) and is checked out (main is its base:
    a head with its base's tree is no change to gate). With `change` (source file, (old,
    new) line, branch, message), the rest is on `main` and that branch adds one
    signed-off commit replacing the line."""
    shutil.copytree(fixture, root)
    repo = git.Repo.init(root, initial_branch="main")
    with repo.config_writer() as cw:
        cw.set_value("user", "name", AUTHOR[0])
        cw.set_value("user", "email", AUTHOR[1])
    repo.index.add(["README.md"])
    repo.index.commit(f"{name}: the project" + SIGNOFF)
    if change is None:
        repo.git.checkout("-b", branch)
    _commit(repo, work)
    if change is not None:
        rel, (old, new), change_branch, message = change
        repo.git.checkout("-b", change_branch)
        source = root / rel
        text = source.read_text()
        if text.count(old) != 1:
            raise AssertionError(f"{rel}: the line the change replaces is not there once")
        source.write_text(text.replace(old, new))
        _commit(repo, message)
    return repo


def paged_decode_subject(root: Path, *, planted_bug: bool = False,
                         hostile: bool = False) -> git.Repo:
    """pagedmini (`_project`): branch `paged-decode` adds its kernels; with
    `planted_bug` (`hostile`), branch `last-page` (`scratch`) plants the last-page bug
    (the hostile writes) in the candidate."""
    change = ((CANDIDATE_SOURCE, LAST_PAGE_BUG, BUG_BRANCH,
               "pf: count the last page's rows with a mask") if planted_bug else
              (CANDIDATE_SOURCE, HOSTILE_WRITE, HOSTILE_BRANCH,
               "pf: scratch state for the next step") if hostile else None)
    return _project(PAGED_DECODE, root, "pagedmini",
                    "pagedmini: paged decode attention kernels, operator and RMSNorm",
                    branch=KERNELS_BRANCH, change=change)


VLLM_PAGED = FIXTURES / "vllm_paged"
VLLM_SOURCE = "kernels/attention/paged_attention_v1.cu"
VLLM_PREFETCH_BUG = ("    if (PF && t + 1 < len) {\n",
                     "    if (PF && t + 2 < len + (len % block_size != 0)) {\n")
"""The prefetching candidate's bound, then a planted bug: when the length is a multiple
of the block size the last token is never prefetched (it reuses the one before)."""


def vllm_paged_subject(root: Path, *, planted_bug: bool = False) -> git.Repo:
    """pagedv (a kernel in vLLM's cache layout, gated through harness/1; `_project`):
    branch `pagedv` adds the kernels, or with `planted_bug` branch `prefetch` the
    candidate's bug."""
    change = ((VLLM_SOURCE, VLLM_PREFETCH_BUG, "prefetch",
               "pa: prefetch only what the block holds") if planted_bug else None)
    return _project(VLLM_PAGED, root, "pagedv",
                    "pagedv: paged attention in vLLM's layout, and its rowgate harness",
                    branch="pagedv", change=change)


SKIPPED = {".git", ".nox", ".whl", "build", "evidence", "__pycache__", ".pytest_cache",
           ".ruff_cache", ".mypy_cache"}


def _files(tree: Path) -> list[str]:
    """What git tracks or would track; without a repository (a device's copy of a
    working tree), every file outside the usual build and cache directories."""
    try:
        out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=tree,
                             capture_output=True, check=True).stdout.decode()
        return [f for f in out.split("\0") if f]
    except (subprocess.CalledProcessError, OSError):
        return [p.relative_to(tree).as_posix() for p in sorted(tree.rglob("*"))
                if p.is_file() and not SKIPPED & set(p.relative_to(tree).parts)]


def snapshot_of(tree: Path, dest: Path) -> Path:
    """rowgate's own tree as the subject: its files committed (signed off) in a fresh
    repository, so the host gate sees a clean signed commit."""
    for rel in _files(tree):
        src = tree / rel
        if src.is_file() and not src.is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    repo = git.Repo.init(dest, initial_branch="main")
    with repo.config_writer() as cw:
        cw.set_value("user", "name", "rowgate-device")
        cw.set_value("user", "email", "device@rowgate.dev")
    # an empty base on main and the tree on a branch: the snapshot is the change gated
    repo.git.commit("--allow-empty", "-m", "base of the device snapshot" + SIGNOFF_DEVICE)
    repo.git.checkout("-b", "snapshot")
    repo.git.add(A=True)
    repo.index.commit("device snapshot of rowgate's tree" + SIGNOFF_DEVICE)
    return dest
