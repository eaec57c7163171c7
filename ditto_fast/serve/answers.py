"""The API's answers, shared by every room's routes: JSON made readable whatever text a stored job holds, and the
one shape of a refusal, `{"error", "exit_code"}`."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from ditto_fast.core.errors import DittoError, UsageError
from ditto_fast.core.files import printable


def readable(value: Any) -> Any:
    """A JSON value with its text made writable as UTF-8 (a file name's other bytes shown as \\xNN: a job an older
    server stored with such a name still lists)."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {readable(k): readable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [readable(v) for v in value]
    return value


class Answer(JSONResponse):
    """The API's JSON answers, readable whatever text a stored job holds."""

    def render(self, content: Any) -> bytes:
        return super().render(readable(content))


def refusal(message: str, status: int, exit_code: int = UsageError.exit_code,
            headers: dict[str, str] | None = None) -> Answer:
    return Answer({"error": message, "exit_code": exit_code}, status_code=status, headers=headers)


def error(e: DittoError, status: int = 400) -> Answer:
    return refusal(str(e), status, e.exit_code)


def busy(e: DittoError) -> Answer:
    """503 for a server whose decoders are all taken (serve/decoded.py), with when to try again (Retry-After)."""
    return refusal(str(e), 503, e.exit_code, headers={"Retry-After": str(getattr(e, "retry_after", 10))})
