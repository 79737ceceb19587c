"""The egress processes talk in JSON lines (config down, acknowledgements up): reading them,
once for the supervisor (the front's answers) and the front (its workers' answers)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

__all__ = ["json_lines"]


async def json_lines(stream: asyncio.StreamReader) -> AsyncIterator[dict[str, Any]]:
    """Each JSON object line of ``stream`` until it ends; a line that is not one (a stray
    print of a library) is passed over."""
    while True:
        line = await stream.readline()
        if not line:
            return
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if isinstance(msg, dict):
            yield msg
