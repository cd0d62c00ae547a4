"""Deterministic simulation of a whole schedulerd cluster in one process (docs/simulation.md)."""
