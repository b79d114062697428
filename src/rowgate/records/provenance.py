"""What a bundle records about what was measured and where: the subject commit, the
host, packages and toolchains, the GPUs. `rowgate.run.provenance` collects them."""

from __future__ import annotations

from pydantic import Field

from rowgate.records.base import Model


class Subject(Model):
    """The commit under gate."""

    repo: str
    branch: str
    commit: str
    tree: str
    base: str
    """Merge-base with the main branch (or HEAD^ when the subject is main itself)."""
    base_branch: str
    dirty: bool
    path: str = ""
    """The subject's directory inside the repository (`lab`; empty: its root): where
    rowgate finds kernels/ and runs the row's commands."""


class Host(Model):
    hostname: str
    os: str
    cpu: str
    cores: int
    python: str


class Gpu(Model):
    index: int
    name: str
    arch: str
    """`sm_XY` from the compute capability."""
    uuid: str
    driver: str
    memory_total_mib: int
    sm_clock_mhz: int
    mem_clock_mhz: int
    max_sm_clock_mhz: int
    temperature_c: int


class Provenance(Model):
    """Where and with what the gates ran (the subject is recorded beside it)."""

    host: Host
    packages: dict[str, str] = Field(default_factory=dict)
    toolchains: dict[str, str] = Field(default_factory=dict)
    gpus: list[Gpu] = Field(default_factory=list)
