"""rowgate: evidence-and-review pipeline for GPU decode-kernel work."""

__version__ = "0.2.0.dev0"
