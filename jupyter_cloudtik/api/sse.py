"""Server-Sent Events: operation events pushed to browsers and kernels as they happen.

Each event goes out as ``id: <event id>`` + ``event: progress`` + ``data: <Event JSON>``.
Event ids are the store's global, increasing ids, so a client that reconnects with
``Last-Event-ID`` (browsers do this by themselves) or ``?after=`` gets exactly the events
it has not seen.  Idle streams carry a comment every ``c.CloudTikServer.event_keepalive``
seconds, which also tells the server when a client has gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from tornado.iostream import StreamClosedError

from ..core.operations import Event

_END = object()


def format_event(event: Event) -> str:
    return f"id: {event.id}\nevent: progress\ndata: {json.dumps(event.to_dict())}\n\n"


async def stream_events(
    handler: Any,
    source: AsyncIterator[Event],
    end: Callable[[], tuple[str, Any]] | None = None,
) -> None:
    """Write ``source`` to ``handler`` as an event stream until it ends or the client goes.

    ``end`` gives a last ``(event name, data)`` to send when the source is exhausted (the
    final state of an operation), so a client knows the stream ended on purpose.
    """
    handler.set_header("Content-Type", "text/event-stream; charset=utf-8")
    handler.set_header("Cache-Control", "no-cache")
    handler.set_header("X-Accel-Buffering", "no")  # proxies must not buffer the stream
    closed = asyncio.Event()
    handler._stream_closed = closed
    queue: asyncio.Queue = asyncio.Queue(maxsize=1000)

    async def pump() -> None:
        try:
            async for event in source:
                await queue.put(event)
        finally:
            await queue.put(_END)

    task = asyncio.create_task(pump())
    keepalive = handler.ctx.server.event_keepalive
    try:
        handler.write("retry: 1000\n\n")
        await handler.flush()
        while not closed.is_set():
            get = asyncio.ensure_future(queue.get())
            gone = asyncio.ensure_future(closed.wait())
            done, _ = await asyncio.wait({get, gone}, timeout=keepalive,
                                         return_when=asyncio.FIRST_COMPLETED)
            gone.cancel()
            if get not in done:
                get.cancel()
                if not done:
                    handler.write(": keepalive\n\n")
                    await handler.flush()
                continue
            item = get.result()
            if item is _END:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise task.exception()
                if end is not None:
                    name, data = end()
                    handler.write(handler.scrub(
                        f"event: {name}\ndata: {json.dumps(data, default=str)}\n\n"))
                break
            handler.write(handler.scrub(format_event(item)))
            # write what is queued before flushing: a burst costs one flush
            while not queue.empty() and queue._queue[0] is not _END:  # type: ignore[attr-defined]
                handler.write(handler.scrub(format_event(queue.get_nowait())))
            await handler.flush()
        if not closed.is_set():
            handler.finish(set_content_type="text/event-stream; charset=utf-8")
    except StreamClosedError:
        pass
    finally:
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        if hasattr(source, "aclose"):
            with contextlib.suppress(BaseException):
                await source.aclose()
