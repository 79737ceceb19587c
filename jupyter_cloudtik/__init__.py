"""jupyter_cloudtik: clusters, storage and HPC jobs from a notebook."""

import os as _os
import sys as _sys

from ._version import __version__


def _skip_slow_iri_format_checker() -> None:
    """jsonschema imports ``rfc3987_syntax`` (when installed, as jupyter_events' extras
    do) for its "iri" format checker, and that module compiles about 40 Lark grammars at
    import: 2 to 4 s added to every CLI call, kernel and daemon start.  No cloudtik schema
    uses the iri formats, so, when jsonschema is not loaded yet, that optional import is
    made to fail as if the package were absent (jsonschema then has no iri checker).
    ``CLOUDTIK_IRI_FORMAT=1`` keeps it."""
    if ("jsonschema" in _sys.modules or "rfc3987_syntax" in _sys.modules
            or _os.environ.get("CLOUDTIK_IRI_FORMAT")):
        return
    _sys.modules["rfc3987_syntax"] = None  # type: ignore[assignment]


_skip_slow_iri_format_checker()

__all__ = ["Cluster", "Workspace", "__version__", "load_ipython_extension"]


def __getattr__(name: str):
    # keep `import jupyter_cloudtik` light: Dask and IPython load only when used
    if name == "Cluster":
        from .clusters.api import Cluster

        return Cluster
    if name == "Workspace":
        from .workspaces.api import Workspace

        return Workspace
    raise AttributeError(name)


def load_ipython_extension(ipython) -> None:
    """`%load_ext jupyter_cloudtik`: register the %cluster magics."""
    from .clusters.magics import register

    register(ipython)


def _jupyter_server_extension_points() -> list[dict[str, object]]:
    """The Jupyter server extension (REST API, an ``ExtensionApp``): enabled by etc/jupyter
    on install."""
    from .server.extension import CloudTikExtension

    return [{"module": "jupyter_cloudtik.server.extension", "app": CloudTikExtension}]


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """The prebuilt JupyterLab side panel inside the package."""
    return [{"src": "labextension", "dest": "jupyter-cloudtik"}]
