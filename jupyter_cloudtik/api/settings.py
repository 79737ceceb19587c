"""Settings of the REST API (``c.CloudTikServer.*``), shared by the server extension and
the hub's sidekick, which both serve the same routes."""

from __future__ import annotations

from traitlets import Bool, Float, Int, Unicode
from traitlets.config import Configurable


class CloudTikServer(Configurable):
    """Settings of the REST API (``c.CloudTikServer.*``)."""

    kernel_access = Bool(
        True,
        help="""Give kernels started by this server the API URL and a token that only the
        cloudtik routes accept (CLOUDTIK_API_URL, CLOUDTIK_API_TOKEN), so the %cluster
        magics and the Cluster API in notebooks use this server's clusters and operations.
        """,
    ).tag(config=True)

    max_body_bytes = Int(
        1024 * 1024, help="Largest request body the API accepts, in bytes (413 above)."
    ).tag(config=True)

    max_stage_bytes = Int(
        1 << 30,
        help="""Largest folder, in bytes, a job may stage from the server's root folder as
        one input (larger data belongs in a storage, named as STORAGE:path).""",
    ).tag(config=True)

    max_upload_bytes = Int(
        32 * 1024 * 1024,
        help="""Largest total, in bytes, of the notebook and input files a job submission
        sends as content (``files``): what a user's server sends to the hub sidekick,
        which never reads the user's paths itself.""",
    ).tag(config=True)

    event_keepalive = Float(
        15.0, help="Seconds between keep-alive comments on idle event streams."
    ).tag(config=True)

    hub_service_url = Unicode(
        "",
        help="""URL of the JupyterHub cloudtik sidekick service (e.g.
        http://127.0.0.1:10101/services/cloudtik/); default $CLOUDTIK_HUB_SERVICE_URL.
        When set, clusters, operations, storage, jobs and hub/ routes are answered by the
        sidekick for this server's hub user (see docs/hub.md).""",
    ).tag(config=True)

    hub_egress = Bool(
        True,
        help="""With a hub sidekick: give kernels the sidekick's egress proxy settings
        (HTTP(S)_PROXY with this user's proxy credential, and a CA bundle that trusts the
        deployment CA), so requests to ruled hosts get their credentials injected.""",
    ).tag(config=True)
