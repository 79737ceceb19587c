"""The mutual-TLS relay in front of the web UIs that listen on a node's loopback (Dask's
dashboard, the Spark master's UI).

Why: Dask's dashboard has no authentication of its own, so on a node other machines reach
it listens on the node's loopback only; and Dask's own dashboard TLS never asks the peer
for a certificate (``Node.start_http_server`` leaves ``verify_mode`` at ``CERT_NONE``:
encryption, not authentication).  This relay is the dashboard's only way in from outside:
TLS that requires a certificate of the cluster's CA (the client's, or a node's) before one
byte reaches the dashboard; then it passes the bytes on both ways (HTTP and websockets
alike).  It ends with the scheduler, so a node whose runtime died keeps no process.

One implementation for every provider whose dashboard is off the Jupyter server's machine:
it is stdlib only, because the nodes have nothing else for certain (a stock cloud image, a
compute node's Python), and its source (``relay_source()``) is what the providers put on
their nodes: Huawei Cloud's node tool embeds it (``cloudtik_node.py dashboard-relay``), the
slurm provider writes it next to its job logs and runs it in the scheduler job.  The key
material stays in the node's private TLS folder; only file names are on a command line.
"""

import os

# --- the part that runs on the nodes: stdlib only, no module-level imports but ``os`` ---


def _alive(pid):
    try:  # a zombie (not yet reaped by whoever adopted it) has ended too
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True


def _route_table(routes):
    """{ALPN protocol: port} and the default port of ROUTES: a port ("8787", 8787: one
    web UI) or "name:port,..." (the client picks one with ALPN "cloudtik-<name>"; a client
    that offers none, or another, gets the first)."""
    if isinstance(routes, int) or str(routes).isdigit():
        return {}, int(routes)
    table = {}
    for item in str(routes).split(","):
        name, _, target = item.partition(":")
        table["cloudtik-" + name] = int(target)
    return table, next(iter(table.values()))


def dashboard_relay(host, port, routes, tls_dir, *pids, cert="cert.pem", key="key.pem",
                    ready=None):
    """Relay ``host:port`` (mutual TLS, the CA ``tls_dir/ca.pem``, presenting ``cert`` and
    ``key`` of ``tls_dir``) to the loopback web UI(s) of ``routes`` until the last of
    ``pids`` (the runtimes it fronts) ends.  ``ready(port)`` is called once it listens
    (``port`` 0: a free port).  One port serves both UIs of a dask,spark head: the
    Jupyter server's Spark UI proxy offers ALPN ``cloudtik-spark``."""
    import asyncio
    import ssl

    table, default = _route_table(routes)
    # the node's loopback, where the UIs listen (an emulated server has one of its own)
    loopback = os.environ.get("NODE_LOOPBACK") or "127.0.0.1"
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH,
                                     cafile=os.path.join(tls_dir, "ca.pem"))
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_cert_chain(os.path.join(tls_dir, cert), os.path.join(tls_dir, key))
    if table:
        ctx.set_alpn_protocols(list(table))

    async def pipe(reader, writer):
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            try:
                writer.close()
            except Exception:
                pass

    async def handle(reader, writer):
        tls = writer.get_extra_info("ssl_object")
        target = table.get(tls.selected_alpn_protocol() if tls else None, default)
        try:
            r2, w2 = await asyncio.open_connection(loopback, int(target))
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, w2), pipe(r2, writer))

    async def main():
        server = await asyncio.start_server(handle, host, int(port), ssl=ctx,
                                            ssl_handshake_timeout=10)
        bound = server.sockets[0].getsockname()[1]
        print(f"[cloudtik] web UI relay (mutual TLS) on {host}:{bound} for {routes}",
              flush=True)
        if ready is not None:
            ready(bound)
        while any(_alive(int(p)) for p in pids):
            await asyncio.sleep(1)
        server.close()
        print("[cloudtik] the runtimes ended: web UI relay stopped", flush=True)

    asyncio.run(main())


# --- end of the node part ---


def relay_source() -> str:
    """The node part of this module as source text (what a node tool embeds)."""
    with open(__file__) as f:
        text = f.read()
    start = text.index("# --- the part that runs on the nodes")
    return "import os\n\n\n" + text[start:text.index("# --- end of the node part ---")]
