"""rowgate.cli."""
