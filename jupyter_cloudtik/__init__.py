"""jupyter_cloudtik: clusters, storage and HPC jobs from a notebook."""

from ._version import __version__

__all__ = ["Cluster", "Workspace", "__version__", "load_ipython_extension"]


def __getattr__(name: str):
    # keep `import jupyter_cloudtik` light: Dask and IPython load only when used
    if name == "Cluster":
        # deferred: start-up (`import jupyter_cloudtik` light: clusters.api ~100 ms, asyncio)
        from .clusters.api import Cluster

        return Cluster
    if name == "Workspace":
        # deferred: start-up (`import jupyter_cloudtik` light: workspaces.api ~120 ms, traitlets)
        from .workspaces.api import Workspace

        return Workspace
    raise AttributeError(name)


def load_ipython_extension(ipython) -> None:
    """`%load_ext jupyter_cloudtik`: register the %cluster magics."""
    # deferred: start-up (`import jupyter_cloudtik` light: clusters.magics ~100 ms, IPython)
    from .clusters.magics import register

    register(ipython)


def _jupyter_server_extension_points() -> list[dict[str, object]]:
    """The Jupyter server extension (REST API, an ``ExtensionApp``): enabled by etc/jupyter
    on install."""
    # deferred: start-up (`import jupyter_cloudtik` light: server.extension ~1.4 s)
    from .server.extension import CloudTikExtension

    return [{"module": "jupyter_cloudtik.server.extension", "app": CloudTikExtension}]


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """The prebuilt JupyterLab side panel inside the package."""
    return [{"src": "labextension", "dest": "jupyter-cloudtik"}]
