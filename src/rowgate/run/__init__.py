"""rowgate.run."""
