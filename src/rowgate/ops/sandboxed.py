"""The child process a subject's kernels run in (`rowgate.ops.launch_child`), seen from
rowgate's side: started once per gate in the sandbox with the GPU, given read-only copies
of the cubins it may load (never the staging area they were sealed in), sent one request
at a time and read back within a time limit, stopped with everything it started.

`KernelChild` is the one way the gates launch subject kernels. `InProcess` answers the
same requests in the calling process, for a project's own tests and benchmarks of its
own kernels (the lab's), where the caller and the kernel are the same party.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from rowgate import sandbox

REQUEST_TIMEOUT_S = 900.0
"""One request (a case's launches, or a shape's timing rounds) may take this long."""
LOG_TAIL = 800


class ChildError(RuntimeError):
    """The kernel child failed a request: said in one line (the request, what happened,
    the end of its log)."""


class Launcher(Protocol):
    def stage(self, path: Path) -> str: ...
    def request(self, req: dict[str, Any]) -> tuple[dict[str, Any], list[bytes]]: ...


class InProcess:
    """The child's handlers called directly: no isolation (a project testing its own
    kernels, never a gate)."""

    def stage(self, path: Path) -> str:
        return str(path)

    def request(self, req: dict[str, Any]) -> tuple[dict[str, Any], list[bytes]]:
        from rowgate.ops.launch_child import HANDLERS

        header, blobs = HANDLERS[req["op"]](req)
        return header, blobs


class KernelChild:
    """`with KernelChild() as child:` a sandboxed child for one gate's launches."""

    def __init__(self, timeout_s: float = REQUEST_TIMEOUT_S, confined: bool | None = None,
                 read_only: tuple[Path, ...] = ()):
        """`read_only`: what else the child may read (a harness's subject, read-only)."""
        self.timeout_s, self.confined, self.read_only = timeout_s, confined, read_only
        self.scratch = Path(tempfile.mkdtemp(prefix="rowgate-kernels-"))
        self.inbox = self.scratch / "in"
        self.inbox.mkdir()
        self.log_path = self.scratch / "child.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.buf = bytearray()

    def __enter__(self) -> KernelChild:
        step = sandbox.Step([sys.executable, "-m", "rowgate.ops.launch_child"], cwd=self.inbox,
                            read_only=[self.inbox, *self.read_only], gpu=True,
                            limits=sandbox.Limits(wall_s=self.timeout_s, memory_bytes=None))
        try:
            with self.log_path.open("wb") as log:
                self.proc = sandbox.spawn(step, confined=self.confined, stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=log)
        except BaseException:
            shutil.rmtree(self.scratch, ignore_errors=True)
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self.close_process()
        shutil.rmtree(self.scratch, ignore_errors=True)

    def close_process(self) -> int | None:
        """Stop the child and everything it started; its exit status (None: not running)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        sandbox.stop(proc)
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                try:
                    pipe.close()
                except BrokenPipeError:  # its buffered request: nobody to read it now
                    pass
        return proc.returncode

    def stage(self, path: Path) -> str:
        """A read-only copy of `path` the child can open (by its digest: two variants'
        cubins of one name stay apart); its path inside the sandbox."""
        data = Path(path).read_bytes()
        dest = self.inbox / f"{hashlib.sha256(data).hexdigest()[:16]}-{Path(path).name}"
        if not dest.exists():
            dest.write_bytes(data)
        return str(dest)

    def log_tail(self) -> str:
        try:
            text = self.log_path.read_bytes()[-LOG_TAIL:].decode(errors="replace")
        except OSError:
            return ""
        return " | ".join(line.strip() for line in text.splitlines() if line.strip())[-LOG_TAIL:]

    def request(self, req: dict[str, Any]) -> tuple[dict[str, Any], list[bytes]]:
        """Send `req`; its header and payload blobs. ChildError when the child reports an
        error, ends, or runs past the time limit (then it is stopped)."""
        if self.proc is None or self.proc.stdin is None:
            raise ChildError("the kernel child is not running")
        deadline = time.monotonic() + self.timeout_s
        try:
            self.proc.stdin.write(json.dumps(req).encode() + b"\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise self._ended(req) from None
        header = json.loads(self._line(deadline, req))
        if "error" in header:
            raise ChildError(f"{req['op']} request: {header['error']}")
        return header, [self._take(n, deadline, req) for n in header["payload"]]

    def _ended(self, req: dict[str, Any]) -> ChildError:
        rc = self.close_process()
        return ChildError(f"the kernel child ended during the {req['op']} request (exit {rc}); "
                          f"its log: {self.log_tail() or 'empty'}")

    def _fill(self, deadline: float, req: dict[str, Any]) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        left = deadline - time.monotonic()
        ready = select.select([fd], [], [], max(left, 0))[0] if left > 0 else []
        if not ready:
            self.close_process()
            raise ChildError(f"the kernel child ran past the {self.timeout_s:g} s limit of one "
                             f"{req['op']} request and was stopped; its log: "
                             f"{self.log_tail() or 'empty'}")
        data = os.read(fd, 1 << 20)
        if not data:
            raise self._ended(req)
        self.buf += data

    def _line(self, deadline: float, req: dict[str, Any]) -> bytes:
        while b"\n" not in self.buf:
            self._fill(deadline, req)
        end = self.buf.index(b"\n") + 1
        line = bytes(self.buf[:end])
        del self.buf[:end]
        return line

    def _take(self, n: int, deadline: float, req: dict[str, Any]) -> bytes:
        while len(self.buf) < n:
            self._fill(deadline, req)
        blob = bytes(self.buf[:n])
        del self.buf[:n]
        return blob
