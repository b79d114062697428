"""rowgate: evidence-and-review pipeline for GPU decode-kernel work."""

__version__ = "0.1.0"
