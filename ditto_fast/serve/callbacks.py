"""A job's callback: its final JSON POSTed to the URL the submitter gave, in the background, retried a few times."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from typing import Callable

RETRY_PAUSES_S = (1.0, 4.0, 15.0)       # after the first try: three more, then the job's callback is given up
TIMEOUT_S = 10.0


def post_job(url: str, body: bytes, log: Callable[[dict], None], job_id: str) -> threading.Thread:
    """POST `body` (the job's JSON, nothing else) to `url` from a daemon thread; each failure is logged."""
    def send() -> None:
        for attempt, pause in enumerate((0.0, *RETRY_PAUSES_S), 1):
            time.sleep(pause)
            request = urllib.request.Request(url, data=body, method="POST",
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=TIMEOUT_S) as reply:   # noqa: S310 - http(s) checked
                    if 200 <= reply.status < 300:
                        return
                    why = f"HTTP {reply.status}"
            except urllib.error.HTTPError as e:
                why = f"HTTP {e.code}"
            except (urllib.error.URLError, OSError) as e:
                why = str(getattr(e, "reason", e))
            log({"job": job_id, "callback": url, "attempt": attempt, "error": f"callback failed: {why}"})

    thread = threading.Thread(target=send, name=f"callback-{job_id}", daemon=True)
    thread.start()
    return thread
