"""Any OpenAI-compatible server, started by a command, on loopback, stopped by its PID.

The server is started from the arm's `command` (placeholders `{port}`, rowgate's
choice of a free loopback port, or `{socket}`, a Unix socket path to listen on
instead, `{model}`, the model directory or file, and `{subject}`, the subject
checkout at the gated commit, are filled in) as the
leader of its own process group, in the subject's checkout when one is given,
so stopping it by its PID takes its worker processes too; the executable it
runs is hashed into `describe()`. Requests are streamed completions with
token-id prompts; the server must return generated token ids and their
logprobs, in vLLM's form (`return_tokens_as_token_ids`: `token_id:N` tokens)
or llama.cpp's (`logprobs.content[].id`); the most likely other tokens come
back as alternatives where the server sends them.

Timings follow vLLM's serving benchmark: TTFT is the time from sending the
request to the first chunk carrying tokens, ITL the gap between successive
such chunks, latency the time to the end of the stream. Concurrency is a cap
on requests in flight; a new one is sent when one finishes.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import shutil
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import rowgate.engines._process as _process
from rowgate import sandbox
from rowgate.engines.interface import Engine, EngineError, PassResult, Request, RequestOutput, WorkloadPass
from rowgate.models.tiny import model_info
from rowgate.sandbox.bridge import Forwarder, UnixHTTPConnection

HOST = "127.0.0.1"
START_TIMEOUT_S = 600.0
SERVER_WALL_S = 6 * 3600.0
"""A sandboxed server's wall-time limit: longer than any row keeps one up (it is
stopped with its arm; the limit only bounds one that is never stopped)."""
REQUEST_TIMEOUT_S = 600.0


class OpenAIEngine(Engine):
    """A server started by `command`; generate() streams /v1/completions."""

    name = "openai"

    logprobs = 5
    """Log-probabilities asked per token: the sampled one and four alternatives
    (src/rowgate/engines/divergence.py tells near-ties from mismatches with them)."""
    extra_body: dict[str, Any] = {}
    """Server-specific request fields (llama.cpp: its prompt cache off)."""

    def __init__(self, command: list[str], model_dir: Path, *, device: str = "cpu",
                 env: dict[str, str] | None = None, start_timeout_s: float = START_TIMEOUT_S,
                 version: str = "", subject: Path | None = None):
        if not command:
            raise EngineError("openai engine: the arm declares no command to start the server")
        self.command, self.model_dir, self.device = command, Path(model_dir), device
        self.subject = Path(subject) if subject else None
        self.extra_env = env or {}
        self.start_timeout_s = start_timeout_s
        self.version = version
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log: Path | None = None
        self.served_model = ""
        self._digest = ""
        self._binary: dict[str, str] = {}
        self._served: sandbox.Served | None = None
        self._socket: Path | None = None
        self.confined_server = True
        """A subject's server (the arm's command, run in the subject) runs in the sandbox."""

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    # -- lifecycle

    def served_path(self) -> Path:
        """What `{model}` names: the model directory (a GGUF file for llama.cpp)."""
        return self.model_dir

    def argv(self) -> list[str]:
        fill = {"port": self.port, "model": self.served_path(), "subject": self.subject or "",
                "socket": self._socket or ""}
        try:
            return [a.format(**fill) for a in self.command]
        except (KeyError, IndexError, ValueError) as exc:
            raise EngineError(f"server command {self.command}: unknown placeholder {exc} "
                              f"(known: {{port}}, {{socket}}, {{model}}, {{subject}})") from exc

    def listens_on_socket(self) -> bool:
        """The command names `{socket}`: the server listens on that Unix socket itself,
        and rowgate's client speaks to it there with no relay (sandboxed or not)."""
        return any("{socket}" in a for a in self.command)

    def start(self) -> None:
        self._digest = model_info(self.model_dir).digest
        self.port = _process.free_port()
        self.log = log = _process.log_path(self.name)
        if self.listens_on_socket():
            self._socket = sandbox.socket_dir() / sandbox.SOCKET_NAME
        argv = self.argv()
        try:
            self._binary = binary_record(argv[0], self.subject)
            self.proc = proc = self._launch(argv, log)
            self.served_model = self._wait_ready(proc, log)
        except BaseException:
            self.stop()
            raise

    def _launch(self, argv: list[str], log: Path) -> subprocess.Popen[bytes]:
        """A subject's server in the sandbox; any other (or one a benchmark runs
        unconfined) as the engine's own process, reached on `{socket}` where it names one."""
        if self.subject is not None and self.confined_server:
            with log.open("ab") as out:  # the server's output, as _process.spawn keeps it
                self._served = sandbox.serve(self._step(argv, self.subject), self.port,
                                             stdout=out, stderr=out, listening=self._socket)
            return self._served.proc
        proc = _process.spawn(argv, _process.engine_env(self.device, self.extra_env), log,
                              cwd=self.subject)
        if self._socket is not None:
            self._served = sandbox.Served(proc, Forwarder(self.port, self._socket), None,
                                          confined=False)
        return proc

    def _wait_ready(self, proc: subprocess.Popen[bytes], log: Path) -> str:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise EngineError(f"{self.name} server exited with {proc.returncode} "
                                  f"before serving (log {log}: {_process.log_tail(log)})")
            try:
                status, body = self._get("/v1/models")
                if status == 200:
                    return str(json.loads(body)["data"][0]["id"])
            except (OSError, http.client.HTTPException, ValueError, KeyError, IndexError):
                pass
            time.sleep(0.5)
        raise EngineError(f"{self.name} server not ready on {HOST}:{self.port} after "
                          f"{self.start_timeout_s:.0f} s (log {log})")

    def stop(self) -> None:
        _process.stop_pid(self.proc)
        if self._served is not None:
            self._served.close()
            self._served = None
        self._drop_socket()

    def _drop_socket(self) -> None:
        if self._socket is not None:
            shutil.rmtree(self._socket.parent, ignore_errors=True)
            self._socket = None

    def _step(self, argv: list[str], subject: Path) -> sandbox.Step:
        """The subject's server as a sandbox step: the subject and the model read-only, its
        profiler's output directory (if traced) writable, its caches in its private /tmp,
        the environment rowgate sets for engines (offline, the device) on the allowlist."""
        env = {k: v for k, v in _process.engine_env(self.device, self.extra_env).items()
               if os.environ.get(k) != v}
        env.update({"VLLM_CACHE_ROOT": "/tmp/vllm-cache",
                    _process.INDUCTOR_CACHE_ENV: "/tmp/torchinductor"})
        writable = [Path(v) for v in self.extra_env.values() if Path(v).is_dir()]
        program = Path(self._binary["binary"]).parent if "binary" in self._binary else None
        reads = [subject, self.served_path(), *([program] if program else [])]
        gpu = self.device.startswith("cuda")
        return sandbox.Step(argv, cwd=subject, read_only=reads, writable=writable, env=env,
                            gpu=gpu, limits=sandbox.Limits(wall_s=SERVER_WALL_S,
                                                           memory_bytes=None))

    def describe(self) -> dict[str, str]:
        return {"engine": self.name, "version": self.version,
                "command": " ".join(self.argv()), "endpoint": f"http://{HOST}:{self.port}/v1",
                "served_model": self.served_model, "model_path": str(self.model_dir),
                "model_digest": self._digest, "device": self.device,
                "cwd": str(self.subject or Path.cwd()), **self._binary,
                "sandbox": "bubblewrap" if self._served and self._served.confined else "none"}

    # -- the server's own profiler: vLLM's HTTP convention

    def untraceable(self) -> str | None:
        return None  # known only when the server answers POST /start_profile

    def enable_profiling(self, out_dir: Path) -> None:
        self.extra_env = {**self.extra_env, "VLLM_TORCH_PROFILER_DIR": str(out_dir)}

    def _post(self, path: str, doc: dict[str, Any], timeout: float = REQUEST_TIMEOUT_S) -> None:
        conn = self._connection(timeout)
        try:
            conn.request("POST", path, body=json.dumps(doc),
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            body = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            raise EngineError(f"{self.name} server: POST {path} failed") from exc
        finally:
            conn.close()
        if resp.status == 404:
            raise EngineError(f"{self.name} server answered 404 to POST {path}: it does not "
                              f"implement vLLM's profiling endpoints (or was started without "
                              f"a profiler)")
        if resp.status != 200:
            raise EngineError(f"{self.name} server: POST {path} answered {resp.status}: "
                              f"{body[:200]!r}")

    def start_profile(self, delay_iterations: int, max_iterations: int) -> None:
        self._post("/start_profile", {"delay_iterations": delay_iterations,
                                      "max_iterations": max_iterations})

    def stop_profile(self) -> None:
        self._post("/stop_profile", {})

    # -- requests

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        """A confined server is reached on its Unix socket directly (the host's port is
        for other clients); an unconfined one on the host's loopback."""
        path = self._served.socket_path if self._served is not None else None
        if path is not None:
            return UnixHTTPConnection(path, timeout)
        return http.client.HTTPConnection(HOST, self.port, timeout=timeout)

    def _get(self, path: str) -> tuple[int, bytes]:
        conn = self._connection(5)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def _body(self, request: Request, work: WorkloadPass) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.served_model, "prompt": list(request.prompt_ids),
                "max_tokens": request.max_tokens, "temperature": work.temperature,
                "top_p": work.top_p, "seed": request.seed, "logprobs": self.logprobs,
                "stream": True, "ignore_eos": work.ignore_eos,
                "return_tokens_as_token_ids": True, "skip_special_tokens": False,
                **self.extra_body}
        if work.top_k > 0:
            body["top_k"] = work.top_k
        return body

    def _stream(self, request: Request, work: WorkloadPass) -> RequestOutput:
        conn = self._connection(REQUEST_TIMEOUT_S)
        ids: list[int] = []
        lps: list[float] = []
        alts: list[tuple[tuple[int, float], ...]] = []
        times: list[float] = []
        try:
            sent = time.perf_counter()
            conn.request("POST", "/v1/completions", body=json.dumps(self._body(request, work)),
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                raise EngineError(f"{self.name} server: request {request.id} answered "
                                  f"{resp.status}: {resp.read()[:300]!r}")
            for raw in resp:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                got = _chunk_tokens(json.loads(data), request.id)
                if got:
                    times.append(time.perf_counter())
                    ids += [t for t, _, _ in got]
                    lps += [lp for _, lp, _ in got]
                    alts += [alt for _, _, alt in got]
            end = time.perf_counter()
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise EngineError(f"{self.name} server: request {request.id} failed") from exc
        finally:
            conn.close()
        return RequestOutput(id=request.id, token_ids=tuple(ids), logprobs=tuple(lps),
                             alternatives=tuple(alts) if any(alts) else (),
                             ttft_s=times[0] - sent if times else None, latency_s=end - sent,
                             itl_s=tuple(b - a for a, b in zip(times, times[1:])))

    def generate(self, work: WorkloadPass) -> PassResult:
        if self.proc is None or self.proc.poll() is not None:
            raise EngineError(f"{self.name} server is not running (log {self.log})")
        lock = threading.Lock()
        outputs: dict[str, RequestOutput] = {}

        def one(request: Request) -> None:
            out = self._stream(request, work)
            with lock:
                outputs[request.id] = out

        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=work.concurrency) as pool:
            for fut in [pool.submit(one, r) for r in work.requests]:
                fut.result()
        wall = time.perf_counter() - start
        return PassResult(outputs=tuple(outputs[r.id] for r in work.requests), wall_s=wall)


def binary_record(program: str, cwd: Path | None) -> dict[str, str]:
    """The executable a server command runs and its sha256: what the provenance ties to
    the gated commit (a subject's own binary is resolved in its checkout)."""
    candidate = Path(program)
    if not candidate.is_absolute() and cwd is not None and (cwd / candidate).is_file():
        path: str | None = str(cwd / candidate)
    else:
        path = shutil.which(program, path=None)
    if path is None:
        raise EngineError(f"server command: {program!r} is neither a file in "
                          f"{cwd or 'the checkout'} nor on PATH")
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return {"binary": str(Path(path).resolve()), "binary_sha256": "sha256:" + h.hexdigest()}


Token = tuple[int, float, tuple[tuple[int, float], ...]]
"""(token id, logprob, alternatives: (id, logprob) of the most likely other tokens)."""


def _token_id(tok: object, request_id: str) -> int:
    if not isinstance(tok, str) or not tok.startswith("token_id:"):
        raise EngineError(f"request {request_id}: the server returned token {tok!r}, not a "
                          f"token id (it must support return_tokens_as_token_ids)")
    return int(tok.removeprefix("token_id:"))


def _vllm_tokens(logprobs: dict[str, Any], request_id: str) -> list[Token]:
    """vLLM's legacy completions form: `tokens` ("token_id:N"), `token_logprobs`,
    `top_logprobs` (one {"token_id:N": logprob} per token)."""
    tops = logprobs.get("top_logprobs") or []
    out = []
    for k, (tok, lp) in enumerate(zip(logprobs.get("tokens") or [],
                                      logprobs.get("token_logprobs") or [])):
        tid = _token_id(tok, request_id)
        top = tops[k] if k < len(tops) and isinstance(tops[k], dict) else {}
        alts = sorted(((_token_id(t, request_id), float(v)) for t, v in top.items()),
                      key=lambda e: -e[1])
        out.append((tid, float(lp), tuple(a for a in alts if a[0] != tid)[:ALTERNATIVES]))
    return out


def _llamacpp_tokens(content: list[dict[str, Any]]) -> list[Token]:
    """llama.cpp's form: `content`, one {"id", "logprob", "top_logprobs": [{"id",
    "logprob"}]} per token."""
    out = []
    for entry in content:
        alts = tuple((int(t["id"]), float(t["logprob"])) for t in entry.get("top_logprobs", [])
                     if int(t["id"]) != int(entry["id"]))
        out.append((int(entry["id"]), float(entry["logprob"]), alts[:ALTERNATIVES]))
    return out


ALTERNATIVES = 4


def _chunk_tokens(chunk: dict[str, Any], request_id: str) -> list[Token]:
    """(token id, logprob, alternatives) of one streamed completion chunk."""
    choices = chunk.get("choices") or []
    if not choices:
        return []  # usage-only chunk
    logprobs = choices[0].get("logprobs") or {}
    if isinstance(logprobs.get("content"), list):
        got = _llamacpp_tokens(logprobs["content"])
    else:
        got = _vllm_tokens(logprobs, request_id)
    if not got and choices[0].get("text"):
        raise EngineError(f"request {request_id}: the server streamed text without token ids "
                          f"and logprobs ({choices[0]['text'][:40]!r})")
    return got
