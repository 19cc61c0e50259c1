"""Runs beside candidate code (the candidate host): loads it, calls it, reports what it saw; decides nothing."""
