"""What the gateway's own tools (memory_search, conversation_search) read from a model's call."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson

from gateway.ports import JSON


def search_parameters(things: str, **more: JSON) -> JSON:
    """The JSON schema of a search tool's arguments: a query, an optional date range over `things`, and
    `more` properties."""
    properties: dict[str, JSON] = {
        "query": {"type": "string", "description": "What to look for, in a few words."},
        "since": {"type": "string", "description": f"Only {things} from this date on (YYYY-MM-DD)."},
        "until": {"type": "string", "description": f"Only {things} up to this date (YYYY-MM-DD)."},
        **more,
    }
    return {"type": "object", "properties": properties, "required": ["query"]}


def _date(value: JSON) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value[:10])
    except ValueError:
        return None
    return parsed.replace(tzinfo=UTC)


def parse_arguments(arguments: str) -> tuple[str, datetime | None, datetime | None] | str:
    """(query, since, until) of a call, or the error the model is told (a string)."""
    try:
        args = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        return "error: the arguments are not valid JSON"
    query = args.get("query") if isinstance(args, dict) else None
    if not isinstance(query, str) or not query.strip():
        return "error: give a query"
    assert isinstance(args, dict)
    return query, _date(args.get("since")), _date(args.get("until"))
