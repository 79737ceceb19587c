"""The embedded local provider (see ``provider.py``; its settings are ``settings.py``).

Kept light: the launcher daemon (``launcher.py``) imports this package before it listens,
and must not pay for the provider's imports (traitlets, psutil, the TLS helpers)."""

__all__ = ["LocalNodeProvider", "LocalProvider"]


def __getattr__(name: str):
    if name == "LocalNodeProvider":
        from . import provider

        return provider.LocalNodeProvider
    if name == "LocalProvider":
        from . import settings

        return settings.LocalProvider
    raise AttributeError(name)
