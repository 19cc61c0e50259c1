"""cuforge.results: the SQLite store, leaderboards, reports."""
