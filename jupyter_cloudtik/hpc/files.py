"""Job folders on a filesystem this process can read: shared by the local and Slurm backends.

Names handed in by callers (``read_file(..., name)``) are checked to stay inside the job's
folder, so a job id or file name can never reach outside it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ..core.errors import ConfigError, NotFoundError
from .base import LogChunk, OutputFile, Submission
from .script import LOG_NAME, MARKER_DIR, PARAMETERS_NAME, SCAFFOLDING, parameters_json

INPUTS_LIST = "inputs"


def inside(folder: Path, name: str) -> Path:
    path = (folder / name).resolve()
    root = folder.resolve()
    if path != root and root not in path.parents:
        raise ConfigError(f"name: {name!r} is outside the job's folder", field="name")
    return path


def prepare_folder(folder: Path, sub: Submission, script: str) -> None:
    """Write the notebook, parameters, uploaded inputs and the script into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MARKER_DIR).mkdir(exist_ok=True)
    for name, local in sub.files.items():
        shutil.copyfile(local, inside(folder, name))
    for item in sub.inputs:
        if item.mode == "upload":
            copy_into(Path(item.source), inside(folder, item.name))
    (folder / PARAMETERS_NAME).write_text(parameters_json(sub))
    (folder / MARKER_DIR / INPUTS_LIST).write_text("\n".join(input_names(sub)) + "\n")
    script_path = folder / "job.sh"
    script_path.write_text(script)
    script_path.chmod(0o755)


def copy_into(src: Path, dest: Path) -> None:
    if src.is_dir():
        shutil.copytree(src, dest, dirs_exist_ok=True)
    else:
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)


def read_log(folder: Path, offset: int, limit: int, name: str = LOG_NAME) -> LogChunk:
    path = folder / name
    try:
        with open(path, "rb") as f:
            # past the end there is nothing yet; seeking there may fail (EINVAL past the
            # file system's largest file), so don't
            if max(0, offset) >= os.fstat(f.fileno()).st_size:
                return LogChunk("", offset, eof=True)
            f.seek(max(0, offset))
            data = f.read(limit)
    except FileNotFoundError:
        return LogChunk("", offset, eof=True)
    # never split a UTF-8 character between two reads
    cut = len(data)
    if len(data) == limit:
        while cut > 0 and (data[cut - 1] & 0xC0) == 0x80:
            cut -= 1
        if cut > 0 and data[cut - 1] >= 0xC0:
            cut -= 1
        cut = cut or len(data)
    text = data[:cut].decode("utf-8", errors="replace")
    return LogChunk(text, offset + cut, eof=len(data) < limit)


def input_names(sub: Submission) -> list[str]:
    """What the session put into the job's folder (not results, so not listed as outputs)."""
    return sorted(set(sub.files) | {i.name for i in sub.inputs})


def list_outputs(folder: Path) -> list[OutputFile]:
    if not folder.exists():
        raise NotFoundError(f"the job's folder {folder} is gone", field="job")
    skip = set(SCAFFOLDING) | {LOG_NAME}
    listed = read_marker(folder, INPUTS_LIST)
    if listed:
        skip |= set(listed.splitlines())
    out = []
    for root, dirs, files in os.walk(folder):
        rel_root = Path(root).relative_to(folder)
        if rel_root == Path("."):
            dirs[:] = [d for d in dirs if d not in skip]
        for fn in sorted(files):
            rel = (rel_root / fn).as_posix()
            if rel in skip:
                continue
            try:
                size = (Path(root) / fn).stat().st_size
            except OSError:
                size = None
            out.append(OutputFile(rel, size))
    return out


def read_marker(folder: Path, name: str) -> str | None:
    try:
        return (folder / MARKER_DIR / name).read_text().strip()
    except OSError:
        return None
