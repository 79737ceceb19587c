"""The shell ``environment.stage`` uses on a ``firecrest`` backend.

FirecREST runs no command of ours, so a command is a batch job (``job_shell.JobShell``)
and files go through its file API (large ones staged).  Kept apart from ``firecrest.py``,
whose job is the backend itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..core.errors import NotFoundError
from .firecrest_files import _int

if TYPE_CHECKING:
    from .firecrest import FirecrestBackend


class FirecrestEnvShell:
    """What ``environment.stage`` needs, through FirecREST: its file API for the files,
    a batch job for a command (FirecREST runs none: ``job_shell.JobShell``)."""

    runs_by_job = True

    def __init__(self, backend: FirecrestBackend) -> None:
        # deferred: start-up (hpc.job_shell ~41 ms, loads asyncio, importlib.metadata)
        from .job_shell import JobShell

        self.backend = backend
        self.where = f"backend '{backend.name}'"
        self._jobs = JobShell(backend)

    def run(self, argv: list[str], input: bytes | None = None, timeout: float = 60.0,
            cwd: str | None = None):
        return self._jobs.run(argv, input, timeout, cwd)

    def mkdir(self, path: str) -> None:
        self.backend._call("mkdir", self.backend.system, path, create_parents=True)

    def listdir(self, path: str) -> dict[str, int | None]:
        """{name: size} of the files in ``path``."""
        try:
            entries = self.backend._call("list_files", self.backend.system, path,
                                         show_hidden=True)
        except NotFoundError:
            return {}
        return {e.get("name", ""): _int(e.get("size")) for e in entries or []
                if e.get("type") != "d"}

    def put(self, local: Path, remote: str) -> None:
        folder, _, name = remote.rpartition("/")
        self.backend._upload_path(Path(local), folder, name)

    def write_bytes(self, path: str, data: bytes, mode: int = 0o644) -> None:
        folder, _, name = path.rpartition("/")
        self.backend._upload_bytes(folder, name, data)
