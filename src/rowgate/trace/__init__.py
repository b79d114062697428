"""Profiler traces for the trace gate: capture, validity, analysis, plots.

One job per module: `events` parses a saved Kineto trace, `capture` records
one delayed range around an engine's decode steps, `validity` refuses traces
that are not evidence, `analysis` computes the measures (pure functions over
the saved trace, so a review can redo them), `plots` draws them for reviewers.
"""
