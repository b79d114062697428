"""Engines a gate drives (oracle, candidate, fallbacks): one interface.

`create(arm, model_dir)` maps the row's `EngineKind` to an implementation:

* `vllm`: the pinned vLLM, offline `LLM` in a subprocess; with option
  `endpoint=true` its OpenAI server on loopback instead;
* `openai`: any OpenAI-compatible server started by the arm's `command`;
* `llama.cpp`: llama.cpp's server (the pinned `xllamacpp` wheel, or the arm's
  `command`) on a GGUF file written from the model directory;
* `reference`: rowgate's own torch decode engine (paged KV cache).

Servers bound to a subject get `subject=` (its checkout at the gated commit):
`{subject}` in their command, and their working directory.

Options (strings, from `rowgate gate --option KEY=VALUE` / the gate):
`endpoint` (true/false), `vllm_max_num_seqs`, `vllm_enforce_eager`, `seed`,
`llamacpp_parallel`, `llamacpp_threads`; for the reference engine
`persistent_schedule`, `persistent_cubin`, `fused_compile` (mode `graph-fused`: a
torch.compile mode or `none`), `fused_cubin`, `fused_chunk`, `nvcc`.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.engines.interface import (
    Engine,
    EngineError,
    PassResult,
    Request,
    RequestOutput,
    WorkloadPass,
)
from pipeline.rowspec import Arm, EngineKind

__all__ = ["Engine", "EngineError", "PassResult", "Request", "RequestOutput", "WorkloadPass",
           "create", "why_unavailable", "why_untraceable"]

_TRUE = ("1", "true", "yes", "on")


def _flag(options: dict[str, str], key: str, default: bool = False) -> bool:
    value = options.get(key)
    return default if value is None else value.strip().lower() in _TRUE


def _int(options: dict[str, str], key: str, default: int) -> int:
    value = options.get(key)
    try:
        return default if value is None else int(value)
    except ValueError as exc:
        raise EngineError(f"--option {key}={value}: not an integer") from exc


def _vllm(arm: Arm, model_dir: Path, device: str, options: dict[str, str],
          subject: Path | None) -> Engine:
    from pipeline.engines.vllm import VllmEngine, VllmServerEngine

    cls = VllmServerEngine if _flag(options, "endpoint") else VllmEngine
    return cls(model_dir, version=arm.version, device=device, dtype=arm.dtype,
               seed=_int(options, "seed", 0),
               enforce_eager=arm.mode == "eager" or _flag(options, "vllm_enforce_eager"),
               max_num_seqs=_int(options, "vllm_max_num_seqs", 16))


def _openai(arm: Arm, model_dir: Path, device: str, options: dict[str, str],
            subject: Path | None) -> Engine:
    from pipeline.engines.openai import OpenAIEngine

    return OpenAIEngine(list(arm.command), model_dir, device=device, version=arm.version,
                        subject=subject)


def _llamacpp(arm: Arm, model_dir: Path, device: str, options: dict[str, str],
              subject: Path | None) -> Engine:
    from pipeline.engines.llamacpp import LlamaCppEngine

    return LlamaCppEngine(model_dir, version=arm.version, command=list(arm.command),
                          device=device, dtype=arm.dtype, seed=_int(options, "seed", 0),
                          parallel=_int(options, "llamacpp_parallel", 16),
                          threads=_int(options, "llamacpp_threads", 2), subject=subject)


def _reference(arm: Arm, model_dir: Path, device: str, options: dict[str, str],
               subject: Path | None) -> Engine:
    from pipeline.engines.reference import ReferenceEngine

    if arm.mode == "graph-fused":
        from pipeline.engines.fused import COMPILE_MODES, FusedEngine

        return FusedEngine(model_dir, device=device, dtype=arm.dtype,
                           compile_mode=options.get("fused_compile", COMPILE_MODES[0]),
                           cubin=options.get("fused_cubin"), nvcc=options.get("nvcc"),
                           chunk=_int(options, "fused_chunk", 0) or None)
    if arm.mode == "persistent":
        from pipeline.engines.persistent import PersistentEngine

        return PersistentEngine(model_dir, device=device, dtype=arm.dtype,
                                schedule=options.get("persistent_schedule", "dynamic-queue"),
                                cubin=options.get("persistent_cubin"),
                                nvcc=options.get("nvcc"))
    return ReferenceEngine(model_dir, device=device, mode=arm.mode, dtype=arm.dtype)


_FACTORIES = {EngineKind.VLLM: _vllm, EngineKind.OPENAI: _openai,
              EngineKind.LLAMA_CPP: _llamacpp, EngineKind.REFERENCE: _reference}


def why_unavailable(arm: Arm) -> str | None:
    """Why `arm`'s engine cannot run on this machine at all (not installed), or None.

    A gate whose arm is missing is PENDING, like one whose hardware is missing: a
    device machine without vLLM (the H200 here) cannot run the oracle live, and says
    so instead of failing to start it. A wrong pinned version is not "missing": the
    engine's start refuses it (ERROR), since running there would be the wrong oracle.
    """
    import shutil

    if arm.engine is EngineKind.VLLM:
        from pipeline.engines.vllm import installed_version

        if installed_version() is None:
            return (f"the {arm.engine.value} {arm.version} arm cannot run on this machine: "
                    f"vLLM is not installed (pip install 'rowgate[engines]')")
    elif arm.engine is EngineKind.OPENAI and arm.command and shutil.which(arm.command[0]) is None:
        return (f"the openai arm's server {arm.command[0]!r} is not on this machine's PATH")
    elif arm.engine is EngineKind.LLAMA_CPP:
        from pipeline.engines import llamacpp

        return llamacpp.why_unavailable(arm.version, list(arm.command))
    return None


def why_untraceable(arm: Arm) -> str | None:
    """Why the trace gate cannot trace `arm` at all (its engine has no profiler rowgate
    can drive), or None. Said before anything starts; an OpenAI server that lacks the
    profiling endpoints is only known when it answers."""
    if arm.engine is EngineKind.LLAMA_CPP:
        from pipeline.engines.llamacpp import UNTRACEABLE

        return UNTRACEABLE
    return None


def create(arm: Arm, model_dir: Path, *, device: str = "cpu",
           options: dict[str, str] | None = None, subject: Path | None = None) -> Engine:
    """The engine for `arm` over `model_dir` on `device` (`cpu` or `cuda:N`); not started.
    `subject`: the checkout a server arm runs in (`{subject}`)."""
    factory = _FACTORIES.get(arm.engine)
    if factory is None:
        raise EngineError(f"engine {arm.engine.value!r} is not implemented here "
                          f"(implemented: {', '.join(k.value for k in _FACTORIES)})")
    return factory(arm, Path(model_dir), device, dict(options or {}), subject)
