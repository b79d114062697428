"""cuda.core as every op uses it: the module (either import path), a cubin's kernels
loaded once, torch's streams handed to cuda.core, and why nothing can launch here.

cuda.core moved from `cuda.core.experimental` to `cuda.core`; both import paths are
accepted (the H200 image pins the version recorded in docs/kernels.md).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any


def why_unavailable() -> str | None:
    """Why no op can launch on this machine, naming everything missing (the operator
    and phase gates are PENDING saying so), or None."""
    missing = []
    try:
        import torch
    except ImportError:
        missing.append("torch is not installed (pip install 'rowgate[ops]')")
    else:
        if not torch.cuda.is_available():
            missing.append("torch sees no CUDA device (a CPU-only torch build, or no driver)")
    try:
        cuda_core()
    except ImportError:
        missing.append("cuda-core is not installed (pip install 'rowgate[ops-gpu]')")
    return "; ".join(missing) or None


def cuda_core() -> Any:
    """The cuda.core module, under either of its import paths."""
    try:
        import cuda.core as cc
        cc.launch  # noqa: B018 - older releases expose the API only under .experimental
    except (ImportError, AttributeError):
        import cuda.core.experimental as cc
    return cc


@cache
def _module(path: str) -> Any:
    cc = cuda_core()
    cc.Device().set_current()
    data = Path(path).read_bytes()
    if hasattr(cc.ObjectCode, "from_cubin"):
        return cc.ObjectCode.from_cubin(data)
    return cc.ObjectCode(data, "cubin")


@cache
def kernel(path: str, name: str) -> Any:
    """The named kernel of a cubin, loaded once."""
    return _module(path).get_kernel(name)


class _TorchStream:
    """Hands torch's stream to cuda.core through the `__cuda_stream__` protocol."""

    def __init__(self, handle: int):
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)


@cache
def stream(handle: int) -> Any:
    """A raw CUDA stream handle (torch's) as a cuda.core stream, made once per handle."""
    dev = cuda_core().Device()
    if handle == 0:  # torch's legacy default stream
        return dev.default_stream
    return dev.create_stream(_TorchStream(handle))


def current_stream(index: int) -> int:
    """torch's current stream on device `index`, as a raw handle."""
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # no Stream object per call
    if raw is not None:
        return int(raw(index))
    return int(torch.cuda.current_stream(index).cuda_stream)
