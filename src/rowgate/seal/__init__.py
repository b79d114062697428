"""rowgate.seal."""
