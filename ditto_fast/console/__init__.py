"""What the commands (commands/) share: their options made from the declarations, the progress display, and the
process's exits."""
