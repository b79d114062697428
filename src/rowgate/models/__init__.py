"""rowgate.models."""
