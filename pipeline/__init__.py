"""rowgate: evidence-and-review pipeline for GPU decode-kernel work."""

from pathlib import Path

__version__ = "0.1.0"

CHECKOUT = Path(__file__).resolve().parent.parent
"""The rowgate checkout: rows/, schemas/, kernels/ and build/ live beside the package
(rowgate is installed editable; every module that needs one of them starts here)."""
