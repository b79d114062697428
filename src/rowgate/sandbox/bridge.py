"""A subject's server in the sandbox, reachable by rowgate's client and nothing else.

The server runs in its own network namespace, where only `lo` exists: it listens on
127.0.0.1:PORT there and can reach nothing outside. One Unix socket, in a directory the
sandbox shares with rowgate, crosses the boundary:

* inside, `python -m rowgate.sandbox.bridge SOCKET PORT -- SERVER...` starts the server
  as its child and forwards each connection on SOCKET to 127.0.0.1:PORT;
* outside, rowgate's own client speaks HTTP on SOCKET directly (`UnixHTTPConnection`),
  and `Forwarder` listens on the host's 127.0.0.1:PORT (the same number) and forwards
  each connection to SOCKET, for any other client of the endpoint.

Bytes are copied as they are; the bridge ends with the server and exits with its code.
"""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

CHUNK = 1 << 16
CONNECT_S = 5.0


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(CHUNK):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def splice(a: socket.socket, b: socket.socket) -> None:
    """Copy both ways until either side closes (two threads), then close both."""
    threads = [threading.Thread(target=_pump, args=pair, daemon=True)
               for pair in ((a, b), (b, a))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    a.close()
    b.close()


class Forwarder:
    """Outside: 127.0.0.1:`port` on the host → the Unix socket at `path`."""

    def __init__(self, port: int, path: Path):
        self.path = path
        self.listener = socket.create_server(("127.0.0.1", port))
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        try:
            inner = connect_unix(self.path, CONNECT_WAIT_S)
        except OSError:
            conn.close()  # the server is not up (yet): the client sees a closed connection
            return
        inner.settimeout(None)  # a stream may idle as long as the server computes
        splice(conn, inner)

    def close(self) -> None:
        self.listener.close()


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP to the server over the Unix socket, for rowgate's own client: no relay in
    rowgate's process, whose threads would share the client's interpreter lock (through
    the forwarder, a served engine's throughput fell 3 % in an A/A on an H100)."""

    def __init__(self, path: Path, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        self.sock = connect_unix(self.path, self.timeout)


CONNECT_WAIT_S = 30.0
"""How long the forwarder waits for room in the server's listen queue."""


def connect_unix(path: Path, timeout: float | None) -> socket.socket:
    """A stream socket connected to `path`, with `timeout` set. A Unix socket whose listen
    queue is full refuses a connect at once (EAGAIN; TCP would resend its SYN): the 8
    streams of a throughput pass opening together overflow a server that listens with
    Python's default backlog of 5 (http.server), so a full queue is waited out, up to
    `timeout`, in 5 ms steps."""
    deadline = time.monotonic() + (timeout if timeout is not None else CONNECT_WAIT_S)
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(str(path))
            return sock
        except BlockingIOError:
            sock.close()
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.005)
        except OSError:
            sock.close()
            raise


def _inside(sock_path: str, port: int, argv: list[str]) -> int:
    server = subprocess.Popen(argv)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path)
    listener.listen(64)
    listener.settimeout(0.5)
    while server.poll() is None:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        try:
            upstream = socket.create_connection(("127.0.0.1", port), timeout=CONNECT_S)
            upstream.settimeout(None)
        except OSError:
            conn.close()
            continue
        threading.Thread(target=splice, args=(conn, upstream), daemon=True).start()
    listener.close()
    os.unlink(sock_path)
    return server.returncode


def main(args: list[str]) -> int:
    sock_path, port, sep, *argv = args
    if sep != "--" or not argv:
        raise SystemExit("usage: python -m rowgate.sandbox.bridge SOCKET PORT -- SERVER...")
    return _inside(sock_path, int(port), argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
