"""Python side of kernels/: load the arch's cubin with cuda.core, launch on
torch's current stream; torch reference implementations beside them."""
