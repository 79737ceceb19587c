"""Storage: rclone remotes as named storages — browse, copy with progress, mount (FUSE).

``StorageManager`` (async, in ``manager.py``) is the API every face and other features use;
``client.StorageClient`` is its synchronous twin for magics, the CLI and scripts.
"""

from .catalog import StorageInfo
from .manager import Location, StorageManager

__all__ = ["Location", "StorageInfo", "StorageManager"]
