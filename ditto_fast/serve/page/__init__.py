"""serve's newsroom page: its routes, the speech uploads and its static files (static/: no build step)."""
