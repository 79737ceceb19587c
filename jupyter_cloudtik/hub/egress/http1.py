"""Bounds mitmproxy 11's HTTP/1 layer does not have: the size of a head, trailer fields
(refused, not a traceback), and a chunked body's chunks of one read handled as one piece.
Patched into its ``Http1Server``/``Http1Client`` once per process."""

from __future__ import annotations

__all__ = ["bound_http1_heads"]

_BOUNDED = False


def bound_http1_heads(max_bytes: int, max_fields: int) -> None:
    """mitmproxy 11 buffers an HTTP/1 head without any bound ("FIXME: protect against
    header size DoS" in its ``_http1.py``): one client could fill our memory with a head
    that never ends.  Heads of clients and upstreams alike are bounded here: a client gets
    431, an upstream's connection is closed (the client gets 502).  Trailer fields, which
    it does not implement (an exception per connection), are refused with a 400."""
    global _BOUNDED
    if _BOUNDED:
        return
    from mitmproxy.proxy import commands, events
    from mitmproxy.proxy.layers.http import _http1

    def wrap(cls: type, server: bool) -> None:
        original = cls.read_headers

        def read_headers(self, event):  # type: ignore[no-untyped-def]
            if isinstance(event, events.DataReceived):
                data = self.buf._data
                end = data.find(b"\r\n\r\n")
                if end < 0:
                    end = data.find(b"\n\n")
                size = len(data) if end < 0 else end
                if size > max_bytes or data.count(b"\n", 0, size) > max_fields + 1:
                    if server:
                        yield commands.SendData(self.conn, _http1.make_error_response(
                            431, f"request head larger than {max_bytes} bytes or "
                                 f"{max_fields} fields"))
                    else:
                        yield commands.Log("upstream response head too large: closed")
                    yield commands.CloseConnection(self.conn)
                    self.state = self.done
                    return
            yield from original(self, event)

        cls.read_headers = read_headers

        def read_body(self, event):  # type: ignore[no-untyped-def]
            # mitmproxy 11 raises NotImplementedError on HTTP/1 trailer fields, which
            # kills the connection with a traceback: refuse them (400) instead.  The
            # trailers themselves are never relayed either way.
            try:
                yield from _read_body_coalesced(self, event)
            except NotImplementedError:
                if server:
                    yield commands.SendData(self.conn, _http1.make_error_response(
                        400, "trailer fields are not accepted"))
                else:
                    yield commands.Log("upstream sent trailer fields: closed")
                yield commands.CloseConnection(self.conn)
                self.state = self.done

        cls.read_body = read_body

    wrap(_http1.Http1Server, True)
    wrap(_http1.Http1Client, False)
    _BOUNDED = True


def _read_body_coalesced(self, event):  # type: ignore[no-untyped-def]
    """mitmproxy's ``Http1Connection.read_body``, but the data of consecutive chunks of one
    read go on as one piece: mitmproxy passed each chunk of a chunked body through its
    layers and wrote it upstream on its own, so a body in one-byte chunks cost a socket
    write (and its framing) per byte, on the loop every client shares (issue 27)."""
    from mitmproxy.proxy import commands, events
    from mitmproxy.proxy.layers.http import _http1
    from mitmproxy.proxy.layers.http._base import ReceiveHttp

    h11 = _http1.h11
    assert self.stream_id is not None
    pending: list[bytes] = []

    def flush():  # type: ignore[no-untyped-def]
        if pending:
            data = b"".join(pending)
            pending.clear()
            yield ReceiveHttp(self.ReceiveData(self.stream_id, data))

    while True:
        try:
            if isinstance(event, events.DataReceived):
                h11_event = self.body_reader(self.buf)
            elif isinstance(event, events.ConnectionClosed):
                h11_event = self.body_reader.read_eof()
            else:
                raise AssertionError(f"Unexpected event: {event}")
        except h11.ProtocolError as e:
            yield from flush()
            yield commands.CloseConnection(self.conn)
            yield ReceiveHttp(self.ReceiveProtocolError(self.stream_id,
                                                        f"HTTP/1 protocol error: {e}"))
            return
        if h11_event is None:
            yield from flush()
            return
        if isinstance(h11_event, h11.Data):
            data = bytes(h11_event.data)
            if data:
                pending.append(data)
        elif isinstance(h11_event, h11.EndOfMessage):
            yield from flush()
            assert self.request
            if h11_event.headers:
                raise NotImplementedError("HTTP trailers are not implemented yet.")
            if self.request.data.method.upper() != b"CONNECT":
                yield ReceiveHttp(self.ReceiveEndOfMessage(self.stream_id))
            is_request = isinstance(self, _http1.Http1Server)
            yield from self.mark_done(request=is_request, response=not is_request)
            return

