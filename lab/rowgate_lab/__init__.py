"""rowgate's lab: its own decode kernels' host side, engines and gate kind.

A subject gated like anyone's: the rows gate `lab/` through the same path as any
repository, and rowgate's core never imports this package. It registers its engines
and its `abi` gate kind through rowgate's entry-point groups (lab/pyproject.toml).
"""

from pathlib import Path

LAB = Path(__file__).resolve().parents[1]
"""The lab subject's root (kernels/, benchmarks/ beside this package): the lab is a
checkout installed editable, never a wheel."""
