"""Engines a gate drives (oracle, candidate, fallbacks): one interface, opened by entry
points of group `rowgate.engines` (rowgate.plugins), rowgate's own included:

* `vllm`: the pinned vLLM, offline `LLM` in a subprocess; with option
  `endpoint=true` its OpenAI server on loopback instead;
* `openai`: any OpenAI-compatible server started by the arm's `command`;
* `llama.cpp`: llama.cpp's server (the pinned `xllamacpp` wheel, or the arm's
  `command`) on a GGUF file written from the model directory;
* `reference`: rowgate's own torch decode engine (paged KV cache), modes `eager`,
  `graph`, `default`.

An entry point names an `EnginePlugin`: how to create the engine for an arm, and why
it could not run or be traced here. Servers bound to a subject get `subject=` (its
checkout at the gated commit): `{subject}` in their command, and their working directory.

Options (strings, from `rowgate gate --option KEY=VALUE` / the gate):
`endpoint` (true/false), `vllm_max_num_seqs`, `vllm_enforce_eager`, `seed`,
`llamacpp_parallel`, `llamacpp_threads`; a plugin's engines read their own.
"""

from __future__ import annotations

from pathlib import Path

from rowgate import plugins
from rowgate.engines._process import (
    INDUCTOR_CACHE,
    INDUCTOR_CACHE_ENV,
    compile_cache_dir,
    use_compile_cache,
)
from rowgate.engines.interface import (
    Engine,
    EngineError,
    EnginePlugin,
    PassResult,
    Request,
    RequestOutput,
    WorkloadPass,
)
from rowgate.rows.spec import Arm

__all__ = ["INDUCTOR_CACHE", "INDUCTOR_CACHE_ENV", "Engine", "EngineError", "EnginePlugin",
           "PassResult", "Request", "RequestOutput", "WorkloadPass", "compile_cache_dir", "create",
           "flag", "integer",
           "plugin", "use_compile_cache", "why_not_mode", "why_unavailable", "why_untraceable"]

_TRUE = ("1", "true", "yes", "on")


def flag(options: dict[str, str], key: str, default: bool = False) -> bool:
    value = options.get(key)
    return default if value is None else value.strip().lower() in _TRUE


def integer(options: dict[str, str], key: str, default: int) -> int:
    value = options.get(key)
    try:
        return default if value is None else int(value)
    except ValueError as exc:
        raise EngineError(f"--option {key}={value}: not an integer") from exc


def _vllm(arm: Arm, model_dir: Path, device: str, options: dict[str, str],
          subject: Path | None) -> Engine:
    from rowgate.engines.vllm import VllmEngine, VllmServerEngine

    seed, seqs = integer(options, "seed", 0), integer(options, "vllm_max_num_seqs", 16)
    eager = arm.mode == "eager" or flag(options, "vllm_enforce_eager")
    if flag(options, "endpoint"):
        return VllmServerEngine(model_dir, version=arm.version, device=device, dtype=arm.dtype,
                                seed=seed, enforce_eager=eager, max_num_seqs=seqs)
    return VllmEngine(model_dir, version=arm.version, device=device, dtype=arm.dtype, seed=seed,
                      enforce_eager=eager, max_num_seqs=seqs, standing=flag(options, "standing"))


def _openai(arm: Arm, model_dir: Path, device: str, options: dict[str, str],
            subject: Path | None) -> Engine:
    from rowgate.engines.openai import OpenAIEngine

    return OpenAIEngine(list(arm.command), model_dir, device=device, version=arm.version,
                        subject=subject)


def _llamacpp(arm: Arm, model_dir: Path, device: str, options: dict[str, str],
              subject: Path | None) -> Engine:
    from rowgate.engines.llamacpp import LlamaCppEngine

    return LlamaCppEngine(model_dir, version=arm.version, command=list(arm.command),
                          device=device, dtype=arm.dtype, seed=integer(options, "seed", 0),
                          parallel=integer(options, "llamacpp_parallel", 16),
                          threads=integer(options, "llamacpp_threads", 2), subject=subject)


def _reference(arm: Arm, model_dir: Path, device: str, options: dict[str, str],
               subject: Path | None) -> Engine:
    from rowgate.engines.reference import ReferenceEngine

    return ReferenceEngine(model_dir, device=device, mode=arm.mode, dtype=arm.dtype)


def _vllm_unavailable(arm: Arm) -> str | None:
    from rowgate.engines.vllm import installed_version

    if installed_version() is None:
        return (f"the {arm.engine} {arm.version} arm cannot run on this machine: "
                f"vLLM is not installed (pip install 'rowgate[engines]')")
    return None


def _openai_unavailable(arm: Arm) -> str | None:
    import shutil

    if arm.command and shutil.which(arm.command[0]) is None:
        return f"the openai arm's server {arm.command[0]!r} is not on this machine's PATH"
    return None


def _llamacpp_unavailable(arm: Arm) -> str | None:
    from rowgate.engines import llamacpp

    return llamacpp.why_unavailable(arm.version, list(arm.command))


def _llamacpp_untraceable(arm: Arm) -> str | None:
    from rowgate.engines.llamacpp import UNTRACEABLE

    return UNTRACEABLE


VLLM = EnginePlugin(create=_vllm, why_unavailable=_vllm_unavailable)
OPENAI = EnginePlugin(create=_openai, why_unavailable=_openai_unavailable)
LLAMA_CPP = EnginePlugin(create=_llamacpp, why_unavailable=_llamacpp_unavailable,
                         why_untraceable=_llamacpp_untraceable)
REFERENCE = EnginePlugin(create=_reference, in_process=True, modes=("eager", "graph", "default"))


def plugin(name: str) -> EnginePlugin:
    """The installed engine `name`; EngineError naming the installed ones if none."""
    found = plugins.load(plugins.ENGINES, name)
    if not isinstance(found, EnginePlugin):
        raise EngineError(plugins.unknown(plugins.ENGINES, name, "engine"))
    return found


def why_unavailable(arm: Arm) -> str | None:
    """Why `arm`'s engine cannot run on this machine at all (not installed), or None.

    A gate whose arm is missing is PENDING, like one whose hardware is missing: a
    device machine without vLLM cannot run the oracle live, and says so instead of
    failing to start it. A wrong pinned version is not "missing": the engine's start
    refuses it (ERROR), since running there would be the wrong oracle.
    """
    return plugin(arm.engine).why_unavailable(arm)


def why_untraceable(arm: Arm) -> str | None:
    """Why the trace gate cannot trace `arm` at all (its engine has no profiler rowgate
    can drive), or None. Said before anything starts; an OpenAI server that lacks the
    profiling endpoints is only known when it answers."""
    return plugin(arm.engine).why_untraceable(arm)


def why_not_mode(arm: Arm) -> str | None:
    """Why `arm`'s engine cannot run in `arm.mode` (its plugin declares the modes it
    runs), or None. An engine that ignored the mode would run in another one under the
    asked mode's name: a trace of the wrong executing path, sealed as the right one."""
    modes = plugin(arm.engine).modes
    if modes and arm.mode not in modes:
        return (f"engine {arm.engine} runs in mode {', '.join(modes)}, not {arm.mode!r} "
                f"(name the arm that runs {arm.mode!r})")
    return None


def create(arm: Arm, model_dir: Path, *, device: str = "cpu",
           options: dict[str, str] | None = None, subject: Path | None = None) -> Engine:
    """The engine for `arm` over `model_dir` on `device` (`cpu` or `cuda:N`); not started.
    `subject`: the checkout a server arm runs in (`{subject}`). EngineError for a mode
    the engine does not run (`why_not_mode`)."""
    why = why_not_mode(arm)
    if why:
        raise EngineError(why)
    found = plugin(arm.engine)
    if found.in_process:  # what it compiles lands in rowgate's cache, kept across runs
        use_compile_cache()
    return found.create(arm, Path(model_dir), device, dict(options or {}), subject)
