"""`rowgate oracle serve`: a row's pinned vLLM oracle kept loaded for runs to attach to.

The oracle is rowgate's own (the pinned, offline vLLM), never a subject's code, so it
runs as the oracle always runs, outside the sandbox; its socket is in a fresh
directory of rowgate's that no subject step is shown. What a run attached to it
records, and why an attached oracle is the same engine, is in `engines.standing`.
"""

from __future__ import annotations

import shutil
import signal
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from rowgate import sandbox
from rowgate.engines import standing
from rowgate.errors import UsageError
from rowgate.rows.row import LoadedRow

SOCKET = "oracle.sock"


def serve_oracle(loaded: LoadedRow, *, device: str = "cpu",
                 options: dict[str, str] | None = None,
                 say: Callable[[str], None] = lambda _msg: None) -> int:
    """Load the row's oracle on `device` and serve attaching runs until interrupted
    (SIGINT or SIGTERM); the worker's exit code if it ends by itself."""
    from rowgate import engines
    from rowgate.engines.vllm import VllmEngine
    from rowgate.models.tiny import resolve_model

    row = loaded.row
    if not row.models:
        raise UsageError(f"oracle serve: row {row.id} declares no [[models]]")
    engine = engines.create(row.arms.oracle, resolve_model(row.models[0]).path, device=device,
                            options={**(options or {}), "standing": "1"})
    if not isinstance(engine, VllmEngine):
        raise UsageError(f"oracle serve: row {row.id}'s oracle is engine "
                         f"{row.arms.oracle.engine!r}; only the offline vLLM oracle stands")
    scratch = sandbox.socket_dir()
    registered: dict[str, Any] = {}

    def ready(hello: dict[str, Any]) -> None:
        key = engine.standing_key()
        registered.update(key=key, pid=hello["pid"])
        standing.register(key, {"key": key, "pid": hello["pid"], "socket": str(scratch / SOCKET),
                                "row": row.id, "since": time.time(), "vllm": hello["vllm"],
                                "device": device, "model_digest": engine.describe()["model_digest"]})
        say(f"standing oracle for {row.id} ({hello['vllm']}, {device}), key {key}: runs "
            f"given --option standing=1 attach to it; interrupt to stop it")

    say(f"loading the oracle ({row.arms.oracle.engine} {row.arms.oracle.version}) on {device}")
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return engine.stand(scratch / SOCKET, ready)
    except KeyboardInterrupt:
        say("standing oracle stopped")
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        if registered:
            standing.unregister(registered["key"], registered["pid"])
        shutil.rmtree(scratch, ignore_errors=True)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt
