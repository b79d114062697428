"""Any OpenAI-compatible server, started by a command, on loopback, stopped by its PID.

The server is started from the arm's `command` (placeholders `{port}` and
`{model}` are filled in) as the leader of its own process group, so stopping
it by its PID takes its worker processes too. Requests are streamed
completions with token-id prompts; the server must return generated token ids
(`return_tokens_as_token_ids`, as vLLM does) and their logprobs.

Timings follow vLLM's serving benchmark: TTFT is the time from sending the
request to the first chunk carrying tokens, ITL the gap between successive
such chunks, latency the time to the end of the stream. Concurrency is a cap
on requests in flight; a new one is sent when one finishes.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pipeline.engines._process as _process
from pipeline.engines.interface import (
    Engine,
    EngineError,
    PassResult,
    Request,
    RequestOutput,
    WorkloadPass,
)
from pipeline.model import model_info

HOST = "127.0.0.1"
START_TIMEOUT_S = 600.0
REQUEST_TIMEOUT_S = 600.0


class OpenAIEngine(Engine):
    """A server started by `command`; generate() streams /v1/completions."""

    name = "openai"

    def __init__(self, command: list[str], model_dir: Path, *, device: str = "cpu",
                 env: dict[str, str] | None = None, start_timeout_s: float = START_TIMEOUT_S,
                 version: str = ""):
        if not command:
            raise EngineError("openai engine: the arm declares no command to start the server")
        self.command, self.model_dir, self.device = command, Path(model_dir), device
        self.extra_env = env or {}
        self.start_timeout_s = start_timeout_s
        self.version = version
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.log: Path | None = None
        self.served_model = ""
        self._digest = ""

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    # -- lifecycle

    def argv(self) -> list[str]:
        return [a.format(port=self.port, model=self.model_dir) for a in self.command]

    def start(self) -> None:
        self._digest = model_info(self.model_dir).digest
        self.port = _process.free_port()
        self.log = _process.log_path(self.name)
        self.proc = _process.spawn(self.argv(), _process.engine_env(self.device, self.extra_env),
                                   self.log)
        try:
            self.served_model = self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> str:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise EngineError(f"{self.name} server exited with {self.proc.returncode} "
                                  f"before serving (log {self.log}: {_process.log_tail(self.log)})")
            try:
                status, body = self._get("/v1/models")
                if status == 200:
                    return json.loads(body)["data"][0]["id"]
            except (OSError, http.client.HTTPException, ValueError, KeyError, IndexError):
                pass
            time.sleep(0.5)
        raise EngineError(f"{self.name} server not ready on {HOST}:{self.port} after "
                          f"{self.start_timeout_s:.0f} s (log {self.log})")

    def stop(self) -> None:
        _process.stop_pid(self.proc)

    def describe(self) -> dict[str, str]:
        return {"engine": self.name, "version": self.version,
                "command": " ".join(self.argv()), "endpoint": f"http://{HOST}:{self.port}/v1",
                "served_model": self.served_model, "model_path": str(self.model_dir),
                "model_digest": self._digest, "device": self.device}

    # -- requests

    def _get(self, path: str) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection(HOST, self.port, timeout=5)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def _body(self, request: Request, work: WorkloadPass) -> dict:
        body = {"model": self.served_model, "prompt": list(request.prompt_ids),
                "max_tokens": request.max_tokens, "temperature": work.temperature,
                "top_p": work.top_p, "seed": request.seed, "logprobs": 1, "stream": True,
                "ignore_eos": work.ignore_eos, "return_tokens_as_token_ids": True,
                "skip_special_tokens": False}
        if work.top_k > 0:
            body["top_k"] = work.top_k
        return body

    def _stream(self, request: Request, work: WorkloadPass) -> RequestOutput:
        conn = http.client.HTTPConnection(HOST, self.port, timeout=REQUEST_TIMEOUT_S)
        ids: list[int] = []
        lps: list[float] = []
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
                    ids += [t for t, _ in got]
                    lps += [lp for _, lp in got]
            end = time.perf_counter()
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise EngineError(f"{self.name} server: request {request.id} failed") from exc
        finally:
            conn.close()
        return RequestOutput(id=request.id, token_ids=tuple(ids), logprobs=tuple(lps),
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


def _chunk_tokens(chunk: dict, request_id: str) -> list[tuple[int, float]]:
    """(token id, logprob) pairs of one streamed completion chunk."""
    choices = chunk.get("choices") or []
    if not choices:
        return []  # usage-only chunk
    logprobs = choices[0].get("logprobs") or {}
    tokens = logprobs.get("tokens") or []
    values = logprobs.get("token_logprobs") or []
    out = []
    for tok, lp in zip(tokens, values):
        if not isinstance(tok, str) or not tok.startswith("token_id:"):
            raise EngineError(f"request {request_id}: the server returned token {tok!r}, not a "
                              f"token id (it must support return_tokens_as_token_ids)")
        out.append((int(tok.removeprefix("token_id:")), float(lp)))
    return out
