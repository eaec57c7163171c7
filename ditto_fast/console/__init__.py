"""What the commands (cli.py) share: their options made from the declarations, and the progress display."""
