"""core.locks.try_flock: the one-daemon-per-state-folder lock the reaper, the storage
supervisor and the local launcher share."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

from jupyter_cloudtik.core.locks import try_flock


def test_second_holder_is_refused_until_the_first_lets_go(tmp_path):
    path = tmp_path / "x.lock"
    fd = try_flock(path)
    assert fd is not None
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    # another process (the real case: a second daemon) sees it busy
    probe = ("import sys; from jupyter_cloudtik.core.locks import try_flock; "
             "sys.exit(0 if try_flock(sys.argv[1]) is None else 1)")
    assert subprocess.run([sys.executable, "-c", probe, str(path)]).returncode == 0
    os.close(fd)
    assert subprocess.run([sys.executable, "-c", probe, str(path)]).returncode == 1


def test_a_missing_folder_is_an_error_not_busy(tmp_path):
    import pytest

    with pytest.raises(FileNotFoundError):
        try_flock(tmp_path / "nowhere" / "x.lock")
