"""rowgate.rows."""
