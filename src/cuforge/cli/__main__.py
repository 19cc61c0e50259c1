from cuforge.cli import app

app()
