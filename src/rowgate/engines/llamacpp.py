"""The llama.cpp arm: llama.cpp's OpenAI-compatible server on a GGUF file written here.

With no `command` the arm runs llama.cpp's server from the pinned `xllamacpp`
wheel (`rowgate.engines._llamacpp_server`: prebuilt for CPUs, so no compiler is
needed); with one, e.g. a `llama-server` binary built at a pinned llama.cpp
commit, that binary (`{model}` is the GGUF file). Either way requests are the
openai engine's: streamed `/v1/completions` with token-id prompts; llama.cpp
answers with token ids and their log-probabilities (and the most likely other
tokens) in `logprobs.content`.

The GGUF file is written from the row's model directory by `rowgate.models.gguf`
and recorded (path, sha256) with the engine. llama.cpp has no profiling
endpoints (`/start_profile`): the trace gate says so instead of tracing it.
"""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

from rowgate.engines.interface import EngineError
from rowgate.engines.openai import OpenAIEngine, binary_record
from rowgate.models.gguf import GgufFile

DISTRIBUTION = "xllamacpp"
UNTRACEABLE = ("llama.cpp's server has no profiling endpoints (vLLM's POST /start_profile, "
               "/stop_profile): its decode steps cannot be traced by rowgate")


def installed_version() -> str | None:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None


def why_unavailable(version: str, command: list[str]) -> str | None:
    """Why the arm cannot run here (-> PENDING), or None. A command names its own
    server binary; without one the pinned xllamacpp wheel must be installed."""
    import shutil

    if command:
        if shutil.which(command[0]) is None and not Path(command[0]).is_file():
            return f"the llama.cpp arm's server {command[0]!r} is not on this machine"
        return None
    if installed_version() is None:
        return (f"the llama.cpp {version} arm cannot run on this machine: {DISTRIBUTION} is "
                f"not installed (pip install 'rowgate[llamacpp]')")
    return None


def _extension() -> str:
    """The xllamacpp extension module: llama.cpp's compiled server, found without
    importing it (the client process never loads llama.cpp)."""
    import importlib.util

    spec = importlib.util.find_spec(f"{DISTRIBUTION}.{DISTRIBUTION}")
    if spec is None or not spec.origin:
        raise EngineError(f"{DISTRIBUTION}: its extension module is missing")
    return spec.origin


class LlamaCppEngine(OpenAIEngine):
    """llama.cpp's server over a GGUF file of the model directory."""

    name = "llama.cpp"
    extra_body = {"cache_prompt": False}

    def __init__(self, model_dir: Path, *, version: str, command: list[str] | None = None,
                 device: str = "cpu", dtype: str = "float32", seed: int = 0,
                 parallel: int = 16, threads: int = 2, subject: Path | None = None,
                 gguf_root: Path | None = None):
        if device != "cpu" and not command:
            raise EngineError(f"llama.cpp arm on {device}: the {DISTRIBUTION} wheel from the "
                              f"registry is a CPU build; give the arm a command that starts "
                              f"a CUDA llama-server")
        self.pinned, self.own_server = version, not command
        self.gguf_root = gguf_root
        self.gguf: GgufFile | None = None
        argv = list(command or [
            sys.executable, "-m", "rowgate.engines._llamacpp_server", "--model", "{model}",
            "--port", "{port}", "--parallel", str(parallel), "--threads", str(threads),
            "--kv-dtype", "float32" if dtype == "float32" else "float16", "--seed", str(seed)])
        super().__init__(argv, model_dir, device=device, version=version, subject=subject)
        self.confined_server = not self.own_server  # the wheel's own server is rowgate's
        self.settings = {"kv_cache_dtype": "float32" if dtype == "float32" else "float16",
                         "flash_attention": "off", "prompt_cache": "off",
                         "parallel": str(parallel), "threads": str(threads)}

    def untraceable(self) -> str | None:
        return UNTRACEABLE

    def enable_profiling(self, out_dir: Path) -> None:
        raise EngineError(UNTRACEABLE)

    def served_path(self) -> Path:
        return self.gguf.path if self.gguf else self.model_dir

    def start(self) -> None:
        from rowgate.errors import Error
        from rowgate.models.gguf import gguf_for

        if self.own_server:
            found = installed_version()
            if found is None:
                raise EngineError(why_unavailable(self.pinned, []) or "")
            if self.pinned and found != self.pinned:
                raise EngineError(f"llama.cpp is pinned to {DISTRIBUTION} {self.pinned}, but "
                                  f"{found} is installed")
        try:
            self.gguf = gguf_for(self.model_dir, self.gguf_root)
        except Error as exc:
            raise EngineError(f"llama.cpp arm: no GGUF file: {exc.diagnostics()}") from exc
        super().start()
        if self.own_server:  # the server's code is the wheel's extension, not the interpreter
            self._binary = binary_record(_extension(), None)

    def describe(self) -> dict[str, str]:
        d = super().describe()
        d.update(engine="llama.cpp", api="openai-server", gguf=str(self.served_path()),
                 gguf_sha256=self.gguf.sha256 if self.gguf else "", **self.settings)
        if self.own_server:
            d.update(distribution=DISTRIBUTION, version=installed_version() or "")
        return d
