"""Previews: one PNG to look at before a clip airs (an avatar's contact sheet, a render's strip)."""
