"""Runs in the jailed worker: inputs, float64 reference, comparison, anti-cheat checks, timing, verdict."""
