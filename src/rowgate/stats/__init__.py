"""rowgate.stats."""
