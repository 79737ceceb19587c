"""Files sent as content with a job (from a user's own server to the hub): checked by name,
written into the job's own content folder only, never anywhere else.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..core import locations as locs
from ..core.errors import ConfigError


class JobContent:
    """Files sent as content (a part of ``JobManager``)."""

    @staticmethod
    def _content_entries(files: dict[str, bytes] | None) -> dict[str, Any]:
        """Sent files by top-level name: bytes for a file, {sub path: bytes} for a folder."""
        out: dict[str, Any] = {}
        for key, data in (files or {}).items():
            locs.check_file_name(key, "files")
            top, _, rest = key.partition("/")
            if rest:
                folder = out.setdefault(top, {})
                if not isinstance(folder, dict):
                    raise ConfigError(f"files: {top!r} is sent as a file and a folder",
                                      field="files")
                folder[rest] = data
            else:
                if top in out:
                    raise ConfigError(f"files: {top!r} is sent twice", field="files")
                out[top] = data
        return out

    def _content_dir(self, job_id: str) -> Path:
        return self.store.state_dir / "hpc" / "content" / job_id

    def _write_content(self, job_id: str, content: dict[str, Any], nb_name: str | None,
                       nb_data: bytes | None) -> dict[str, Any]:
        """Write sent files into this job's own content folder (nowhere else)."""
        out: dict[str, Any] = {}
        if not content and nb_data is None:
            return out
        base = self._content_dir(job_id)
        base.mkdir(parents=True, exist_ok=True)
        if nb_data is not None and nb_name is not None:
            path = base / ".notebook" / nb_name
            path.parent.mkdir()
            path.write_bytes(nb_data)
            out["notebook"] = str(path)
        for top, data in content.items():
            target = base / top
            if isinstance(data, dict):
                for rest, chunk in data.items():
                    f = target / rest
                    f.parent.mkdir(parents=True, exist_ok=True)
                    f.write_bytes(chunk)
            else:
                target.write_bytes(data)
            out.setdefault("inputs", {})[top] = str(target)
        return out


def _notebook_json(data: bytes) -> dict[str, Any]:
    import json

    try:
        nb = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ConfigError(f"notebook: the sent notebook is not JSON ({e})",
                          field="notebook") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list) \
            or nb.get("nbformat", 0) < 4:
        raise ConfigError("notebook: the sent notebook is not a version-4 notebook",
                          field="notebook")
    return nb
