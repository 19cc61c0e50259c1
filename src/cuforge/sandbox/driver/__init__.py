"""Runs in the cuforge process: starts and supervises jailed workers, hands them evaluations, keeps GPU turns."""
