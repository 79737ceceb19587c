"""The hub's faces in a user's kernel and terminal: ``%sidekick``, ``jupyter cloudtik
hub-service|sidekick ...``.  Its routes and tables (catalogue, quotas, egress) exist only
in the sidekick host, which mounts and migrates them itself (``hub/service.py``)."""

from ..core.features import Feature

FEATURE = Feature(
    "hub",
    magics=("jupyter_cloudtik.hub.magics:SidekickMagics",),
    cli=("jupyter_cloudtik.hub.cli",),
)
