"""The embedded local provider (see ``provider.py``; its settings are ``settings.py``).

Kept light: the launcher daemon (``launcher.py``) imports this package before it listens,
and must not pay for the provider's imports (traitlets, psutil, the TLS helpers)."""

__all__ = ["LocalNodeProvider", "LocalProvider"]


def __getattr__(name: str):
    if name == "LocalNodeProvider":
        # deferred: start-up (providers.local.provider ~69 ms, loads traitlets, ssl)
        from . import provider

        return provider.LocalNodeProvider
    if name == "LocalProvider":
        # deferred: start-up (providers.local.settings ~42 ms, loads traitlets)
        from . import settings

        return settings.LocalProvider
    raise AttributeError(name)
