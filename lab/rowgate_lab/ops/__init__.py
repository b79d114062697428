"""rowgate_lab.ops."""
