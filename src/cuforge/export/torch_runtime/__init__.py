"""Files copied verbatim into exported torch packages (they import nothing from cuforge)."""
