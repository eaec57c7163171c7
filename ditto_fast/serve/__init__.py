"""The warm engine: `ditto-fast serve` keeps one engine loaded and renders jobs from a durable queue, fed by an HTTP
job API and watch folders (pip extra [serve]: FastAPI, uvicorn, prometheus_client)."""
