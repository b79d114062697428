"""rowgate's engine fixtures (the tiny model, the demo workload) for the lab's engines."""

from tests.engines.conftest import demo_passes, tiny_model  # noqa: F401
