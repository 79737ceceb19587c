"""The embedded local provider (see ``provider.py``).

Kept light: the launcher daemon (``launcher.py``) imports this package before it listens,
and must not pay for the provider's imports (traitlets, psutil, the TLS helpers)."""

__all__ = ["LocalNodeProvider", "LocalProvider"]


def __getattr__(name: str):
    if name in __all__:
        from . import provider

        return getattr(provider, name)
    raise AttributeError(name)
