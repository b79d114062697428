"""Engines a gate drives (oracle, candidate, fallbacks): one interface."""
