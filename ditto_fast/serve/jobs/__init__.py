"""serve's jobs: the durable queue (SQLite), a job's checks and acceptance, the dispatch threads to the engine
handles, the watch folder, the callbacks' outbox and the server's lease; the job routes of the API."""
