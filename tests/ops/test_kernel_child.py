"""The kernel child: the process a subject's kernels run in, in the sandbox, talking to
rowgate over its protocol. On the CPU: it runs confined (its own pid namespace, only its
staged copies visible), draws a case's inputs bit for bit as rowgate does, reports its
errors in one line, and is stopped at its time limit or named when it dies. The GPU side
(launches, the hostile kernel) is in tests/gates/test_subject_gpu.py."""

from __future__ import annotations

import pytest

from rowgate.ops.cases import Case, seq_lengths
from rowgate.ops.paged_inputs import fingerprint, make_inputs
from rowgate.ops.sandboxed import ChildError, KernelChild

pytestmark = pytest.mark.usefixtures("needs_bwrap")


@pytest.fixture
def needs_bwrap():
    from rowgate import sandbox

    try:
        sandbox.check_available()
    except sandbox.SandboxUnavailable as exc:
        pytest.skip(str(exc))


def _case(batch: int = 4, context: int = 300) -> Case:
    return Case(1, batch, "ragged", str(context), 16, "e5m2", 8, 2, 64,
                seq_lengths("ragged", context, batch, 1))


def test_the_child_runs_in_its_own_pid_namespace_and_draws_rowgates_inputs():
    case = _case()
    with KernelChild() as child:
        header, blobs = child.request({"op": "describe", "case": case.as_dict()})
    assert blobs == []
    assert header["pid"] <= 3, header  # bwrap is pid 1 of the namespace, the child 2
    assert header["inputs"] == fingerprint(make_inputs(case, "cpu"))


def test_a_staged_copy_is_all_the_child_sees_of_a_staging_area(tmp_path):
    staging = tmp_path / "staging" / "build"
    staging.mkdir(parents=True)
    (staging / "k.cubin").write_bytes(b"\x7fELF not really")
    (staging / "secret.txt").write_text("staging")
    with KernelChild() as child:
        inside = child.stage(staging / "k.cubin")
        assert not inside.startswith(str(staging)) and inside.endswith("-k.cubin")
        header, _ = child.request({"op": "describe", "paths": [
            inside, str(staging / "k.cubin"), str(staging / "secret.txt"), str(tmp_path)]})
    assert list(header["visible"].values()) == [True, False, False, False]


def test_an_error_in_a_request_is_one_line_and_the_child_goes_on():
    with KernelChild() as child:
        with pytest.raises(ChildError, match=r"^time request: KeyError: 'case'$"):
            child.request({"op": "time", "operator": "x", "table": {}})
        header, _ = child.request({"op": "describe"})
        assert "torch" in header


def test_a_request_past_the_time_limit_stops_the_child():
    big = _case(batch=16, context=200_000)  # drawing its inputs on the CPU takes seconds
    with KernelChild(timeout_s=0.5) as child:
        with pytest.raises(ChildError, match=r"ran past the 0.5 s limit of one describe request"):
            child.request({"op": "describe", "case": big.as_dict()})
        assert child.proc is None
        with pytest.raises(ChildError, match="not running"):
            child.request({"op": "describe"})


def test_a_child_that_dies_is_named_with_its_exit_and_its_log():
    with KernelChild() as child:
        child.request({"op": "describe"})
        assert child.proc is not None and child.proc.stdin is not None
        child.proc.stdin.write(b"not a request\n")  # the child's own loop fails on it
        with pytest.raises(ChildError, match=r"the kernel child ended during the describe "
                                             r"request \(exit 1\); its log: .*JSONDecodeError"):
            child.request({"op": "describe"})
        assert child.proc is None


@pytest.mark.parametrize("confined", [True, False], ids=["confined", "unconfined"])
def test_a_step_imports_what_rowgate_does_confined_or_not(tmp_path, monkeypatch, confined):
    """rowgate installed into a directory on PYTHONPATH (a device's carried site): a step's
    Python gets that directory, in the sandbox and with it off alike (the kernel child is
    `python -m rowgate.ops.launch_child`)."""
    import sys

    from rowgate import sandbox
    from rowgate.sandbox import runner

    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.setattr(runner, "_import_path", lambda: [site])
    step = sandbox.Step([sys.executable, "-c", "import os; print(os.environ['PYTHONPATH'])"],
                        cwd=tmp_path)
    done = sandbox.run(step, confined=confined)
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().strip() == str(site)
