"""Settings of the hub sidekick (``c.CloudTikHub.*`` in the service's config file)."""

from __future__ import annotations

from traitlets import Bool, Float, Int, List, Unicode
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
        own machine under its account: the `local` provider and the `local`/`dask` HPC
        backends.  That account holds the secret store's key, so such users could read
        every credential: allow it only for trusted users or tests.  Remote providers
        (huaweicloud, dask-gateway) and HPC systems (slurm, firecrest, arc) are not
        affected.""",
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

    egress_engine = Unicode(
        "mitmproxy",
        help="""The egress proxy's engine: 'mitmproxy' (HTTP/1, HTTP/2, WebSockets; runs in
        its own environment, see docs/hub-egress.md) or 'builtin' (the older HTTP/1.1-only
        proxy).""",
    ).tag(config=True)

    egress_deny_networks = List(
        Unicode(), default_value=None, allow_none=True,
        help="Networks the egress proxy refuses to reach (CIDRs); None: its default "
             "(loopback, link-local and private ranges, against SSRF).",
    ).tag(config=True)

    egress_no_proxy = Unicode(
        "localhost,127.0.0.1,::1",
        help="NO_PROXY given to sessions with the proxy settings.",
    ).tag(config=True)
