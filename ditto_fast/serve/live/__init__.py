"""serve's live sessions: the sessions (each streaming an avatar, fed the speech its WebSocket brings) and their
routes and WebSocket."""
