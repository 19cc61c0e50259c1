"""cuforge.sandbox: compile, verify, time and profile candidates in isolated worker processes."""
