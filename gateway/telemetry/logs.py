"""Logs: one line per chat request (`gateway.requests`), and the formatter for `server.log_format: json`.

A request line carries ids, counts and timings only: never a key, never message text.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime

import orjson

REQUESTS = logging.getLogger("gateway.requests")
FIELDS = "fields"  # the LogRecord attribute holding a line's structured fields


def logging_requests() -> bool:
    """Whether request lines are written (check before building one: the hot path)."""
    return REQUESTS.isEnabledFor(logging.INFO)


def log_request(fields: Mapping[str, object]) -> None:
    text = " ".join(f"{k}={v}" for k, v in fields.items() if v is not None)
    REQUESTS.info("request %s", text, extra={FIELDS: dict(fields)})


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and the record's fields if it has any."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        fields = getattr(record, FIELDS, None)
        if isinstance(fields, dict):
            line["message"] = record.msg.split(" ", 1)[0] if isinstance(record.msg, str) else str(record.msg)
            line.update(fields)
        else:
            line["message"] = record.getMessage()
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


def configure(level: str, form: str) -> None:
    """The process's logging, from `server.log_level` and `server.log_format`."""
    handler = logging.StreamHandler()
    if form == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(level.upper())
