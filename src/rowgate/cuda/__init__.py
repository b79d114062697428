"""Building CUDA for a subject: its `kernels/kernels.toml` (`kernels`), the toolchains
from wheels (`toolchains`: CUDA 12.8 NVRTC + ptxas for sm_70, CUDA 13 nvcc for sm_75+),
the cached build recipe (`cudabuild`, with the NVRTC driver `_nvrtc`), reading ptxas /
cuobjdump output against budgets (`resources`), the Triton AOT probe (`_triton_aot`), and
`rowgate build` outside a bundle (`local`).

The build and audit gates build through here; `local` is the one module of this package
that stands above them (it runs their measure and derive)."""
