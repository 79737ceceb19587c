"""Settings of the hub sidekick (``c.CloudTikHub.*`` in the service's config file)."""

from __future__ import annotations

from traitlets import Bool, Enum, Float, Int, List, Unicode
from traitlets.config import Configurable


class CloudTikHub(Configurable):
    """The sidekick: catalogue bootstrap file, group lookups, egress proxy, side-kicks."""

    catalog_file = Unicode(
        "",
        help="""A YAML file of catalogue resources and quotas applied at start-up
        (``resources: [{kind, name, spec, secrets, users, groups}]``, ``quotas: {subject:
        limits}``).  Secret values may be ``{env: NAME}`` so the file itself holds none.
        The API and the admin page change the same catalogue at run time.""",
    ).tag(config=True)

    allow_local_execution = Bool(
        False,
        help="""Let the catalogue offer users things that run their code on the sidekick's
        own machine: the `local` provider (nodes, setup_commands), the `local`/`dask` HPC
        backends, and side-kicks that run users' jobs locally (the job gateway's local
        backends).  Even then they run in the sandbox (c.CloudTikHub.sandbox), never as
        the account that holds the secret store's key; still, they share the machine's
        CPU, memory and network.  Remote providers (huaweicloud, dask-gateway, slurm) and
        HPC systems (slurm, firecrest, arc) are not affected.""",
    ).tag(config=True)

    sandbox = Unicode(
        "bubblewrap",
        help="""How what users control runs on the sidekick's machine (side-kicks, and
        with allow_local_execution local clusters and jobs): 'bubblewrap' (default) — a
        sandbox that sees only the system, Python and its own folder, its own processes,
        as sandbox_uid when the service is root (docs/security.md#the-sandbox); 'none' —
        as the service itself, next to every credential (only if every user may read
        them all).  Without bubblewrap nothing of a user's is started.""",
    ).tag(config=True)

    sandbox_uid = Int(65534, help="Account (uid) sandboxed processes run as when the "
                                  "service runs as root.").tag(config=True)

    sandbox_gid = Int(65534, help="Group (gid) of sandboxed processes when the service "
                                  "runs as root.").tag(config=True)

    sandbox_readable = List(
        Unicode(), default_value=[],
        help="Extra paths sandboxed processes may read (besides the system, Python and "
             "their own folder): a site's software tree, a side-kick's config file.",
    ).tag(config=True)

    allow_token_user_actions = Bool(
        False,
        help="""Let bearer tokens do what otherwise needs the person's own browser session
        at the sidekick: changing egress rules and answering share offers (users), the
        catalogue, quotas and workspaces (admins).  A user's server holds a token kernels
        of that server can read (they share its OS account), so by default these actions
        are refused to every token; allow them only for automation you trust (the
        catalogue file needs no token).""",
    ).tag(config=True)

    group_cache_seconds = Float(
        30.0, help="How long a user's hub groups are cached before asking the hub again."
    ).tag(config=True)

    admin_groups = List(
        Unicode(), default_value=[],
        help="Hub groups whose members are sidekick admins (besides hub admins and holders "
             "of custom:cloudtik:admin).",
    ).tag(config=True)

    session_check_interval = Float(
        15.0,
        help="""Seconds between checks that users with running side-kicks still have a
        running server (asked of the hub; needs scope read:servers for the service).  The
        side-kicks of a user whose server stopped are stopped.  0 disables the check.""",
    ).tag(config=True)

    egress_enabled = Bool(
        True, help="Start the egress proxy (credential-injecting forward proxy)."
    ).tag(config=True)

    egress_port = Int(0, help="Port of the egress proxy on 127.0.0.1 (0: any free one)."
                      ).tag(config=True)

    egress_upstream_ca_bundle = Unicode(
        "", help="CA bundle the egress proxy trusts for upstream HTTPS (default: the "
                 "operating system's trust store; for tests only)."
    ).tag(config=True)

    egress_engine = Enum(
        ["mitmproxy"], default_value="mitmproxy",
        help="""The egress proxy's engine: 'mitmproxy' (HTTP/1, HTTP/2, WebSockets; runs in
        its own environment, see docs/hub-egress.md).  The older 'builtin' engine was
        removed: it did not hold the attack cases mitmproxy holds.""",
    ).tag(config=True)

    egress_deny_networks = List(
        Unicode(), default_value=None, allow_none=True,
        help="Networks the egress proxy refuses to reach (CIDRs); None: its default "
             "(loopback, link-local and private ranges, against SSRF).",
    ).tag(config=True)

    egress_client_connections = Int(
        256, help="""Open connections one client (an authenticated user; the peer address
        before it authenticated) may hold at the egress proxy; more are answered 429.""",
    ).tag(config=True)

    egress_client_lookups = Int(
        4, help="""Name look-ups of one client at once in the egress proxy; its others wait
        for its own slots (up to egress_lookup_timeout, then 504), never for another
        client's.""",
    ).tag(config=True)

    egress_client_handshakes = Int(
        4, help="""TLS set-ups (intercepted CONNECTs) of one client at once in the egress
        proxy; more wait up to the handshake timeout, then 503.""",
    ).tag(config=True)

    egress_lookup_timeout = Float(
        5.0, help="Seconds the egress proxy gives one name look-up (504 after).",
    ).tag(config=True)

    egress_min_body_rate = Float(
        1024.0, help="""Bytes per second a request body must average through the egress
        proxy once it has been read for 10 s; slower bodies are cut off (their connection
        closed).  0 disables the check.""",
    ).tag(config=True)

    egress_body_grace = Float(
        10.0, help="""Seconds a request body is read before egress_min_body_rate applies.""",
    ).tag(config=True)

    egress_handshake_timeout = Float(
        10.0, help="""Seconds a connection to the egress proxy has to authenticate (its
        first request head or CONNECT), and an intercepted CONNECT to finish its TLS
        set-up; then it is closed.""",
    ).tag(config=True)

    egress_preauth_connections = Int(
        1024, help="""Connections of one peer address that have not authenticated yet at
        the egress proxy (every session on the hub host is 127.0.0.1: this is one budget
        for all their first heads); over it, that address's oldest unauthenticated
        connection is closed, so idle sockets cannot keep a new honest one out.""",
    ).tag(config=True)

    egress_client_loop_share = Float(
        0.5, help="""Share (0 < x <= 1) of the egress proxy's event loop one client may take
        while other clients are active; a client over it waits before its next data is
        handled.  A client alone is never held back.""",
    ).tag(config=True)

    egress_lookup_threads = Int(
        64, help="""Threads of the egress proxy's resolver, shared by all clients (each has
        egress_client_lookups of them at most).""",
    ).tag(config=True)

    egress_client_forget_seconds = Float(
        60.0, help="""A client of the egress proxy with no connection, nothing in progress
        and no activity for this long is forgotten (the per-client table stays bounded
        under a stream of distinct users or peers).""",
    ).tag(config=True)

    egress_workers = Int(
        16, help="""Processes of the egress proxy that each serve one user: a user's
        traffic, however expensive, is the operating system's to share out against other
        users' (a process each), not one event loop's.  About 70 MB each while in use; one
        idle for egress_client_forget_seconds ends.  Over this many active users, users
        share them (fewest users first) and share that process's loop by turns.""",
    ).tag(config=True)

    kernels_per_user = Int(
        4, help="""Interactive HPC kernels one user may have through the sidekick at once
        (docs/hpc.md, Interactive kernels through the hub).""",
    ).tag(config=True)

    kernel_lease = Float(
        120.0, help="""Seconds an HPC kernel started through the sidekick lives on without
        its user's server asking after it (it does every few seconds while it runs): then
        its job is ended, so a killed server does not hold an allocation until the wall
        time.""",
    ).tag(config=True)

    egress_no_proxy = Unicode(
        "localhost,127.0.0.1,::1",
        help="NO_PROXY given to sessions with the proxy settings.",
    ).tag(config=True)
