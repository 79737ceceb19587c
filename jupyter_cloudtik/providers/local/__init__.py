"""The embedded local provider (see ``provider.py``)."""

from .provider import LocalNodeProvider, LocalProvider

__all__ = ["LocalNodeProvider", "LocalProvider"]
