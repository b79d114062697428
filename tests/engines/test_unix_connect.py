"""Connecting to a server's Unix socket (`{socket}` arms): a full listen queue is waited
out, not a failed request. On a Unix socket a connect beyond the backlog fails at once
with EAGAIN (TCP would resend its SYN): a throughput pass opens 8 streams together, more
than a server listening with Python's default backlog of 5 queues."""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from rowgate.sandbox.bridge import UnixHTTPConnection, connect_unix


def _slow_server(path, backlog: int, stop: threading.Event) -> threading.Thread:
    """Listens with `backlog` and answers one HTTP request at a time, slowly."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(backlog)
    listener.settimeout(0.1)

    def serve() -> None:
        with listener:
            while not stop.is_set():
                try:
                    conn, _ = listener.accept()
                except TimeoutError:
                    continue
                with conn:
                    conn.recv(4096)
                    time.sleep(0.05)
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n"
                                 b"Connection: close\r\n\r\nok")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def test_eight_streams_at_once_reach_a_server_with_a_backlog_of_one(tmp_path):
    path, stop = tmp_path / "s.sock", threading.Event()
    server = _slow_server(path, 1, stop)

    def one(_: int) -> bytes:
        conn = UnixHTTPConnection(path, timeout=10.0)
        try:
            conn.request("GET", "/")
            return conn.getresponse().read()
        finally:
            conn.close()

    try:
        with ThreadPoolExecutor(8) as pool:
            assert list(pool.map(one, range(8))) == [b"ok"] * 8
    finally:
        stop.set()
        server.join()


def test_a_socket_nobody_listens_on_fails_at_once(tmp_path):
    start = time.monotonic()
    with pytest.raises(FileNotFoundError):
        connect_unix(tmp_path / "none.sock", 5.0)
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(tmp_path / "dead.sock"))
    dead.close()  # bound, never listening: refused
    with pytest.raises(ConnectionRefusedError):
        connect_unix(tmp_path / "dead.sock", 5.0)
    assert time.monotonic() - start < 1.0


def test_a_queue_that_stays_full_fails_after_the_timeout(tmp_path):
    path = tmp_path / "full.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(0)  # never accepts
    held = []
    try:
        with pytest.raises(BlockingIOError):
            for _ in range(8):  # the queue fills, then connects are refused with EAGAIN
                held.append(connect_unix(path, 0.2))
        assert held  # the queue took some before it was full
    finally:
        for s in held:
            s.close()
        listener.close()
