"""HPC checks that must fail closed (issue 28, point 1): an error inside a check is said,
never read as "nothing to check"."""

from __future__ import annotations

import pytest
from traitlets.config import Config

from jupyter_cloudtik.core.errors import ConfigError


def test_an_unreadable_storage_catalogue_is_not_read_as_no_storage(hpc_state, tmp_path):
    """``NAME:path`` is a storage location when NAME is a storage here.  When the storages
    cannot be read (here: rclone configured at a path that is no program), the job is
    refused with that cause; before, the error meant "not a storage", and a local file
    named ``mydata:in.csv`` in the working folder was staged instead."""
    from jupyter_cloudtik.core.settings import CloudTik
    from jupyter_cloudtik.hpc.client import JobsClient
    from jupyter_cloudtik.hpc.commands import build_spec
    from jupyter_cloudtik.hpc.settings import HPC

    (tmp_path / "mydata:in.csv").write_text("1\n")  # the session's working folder
    config = Config({"Storage": {"rclone_path": str(tmp_path / "no-rclone")}})
    client = JobsClient(settings=CloudTik(config=config, state_dir=str(hpc_state)),
                        hpc=HPC(backends={}))
    try:
        with pytest.raises(ConfigError) as e:
            client.submit(build_spec(command="cat in.csv", inputs=["mydata:in.csv"]), "local")
        assert e.value.field == "storage"
        assert e.value.message == (
            "storage 'mydata': cannot tell whether 'mydata:...' names a storage: the "
            f"storages here cannot be read (c.Storage.rclone_path: "
            f"'{tmp_path / 'no-rclone'}' is not an executable file)")
        assert client.list() == []  # nothing was recorded
    finally:
        client.close()
