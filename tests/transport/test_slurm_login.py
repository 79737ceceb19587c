"""The Slurm login node both users share (``transport/slurm.py``): the Slurm provider gets a
configured HPC backend's through hpc's ``slurm_login`` service (the registry), never by
importing hpc, and runs real commands through it on this machine."""

from __future__ import annotations

import pytest
from traitlets.config import Config

from jupyter_cloudtik.core import features
from jupyter_cloudtik.core.errors import BackendUnavailable, ConfigError
from jupyter_cloudtik.core.settings import CloudTik
from jupyter_cloudtik.core.store import Store
from jupyter_cloudtik.providers.base import ProviderContext
from jupyter_cloudtik.providers.slurm import SlurmNodeProvider
from jupyter_cloudtik.transport.slurm import SlurmLogin


def _provider(state_dir, provider: dict) -> SlurmNodeProvider:
    backends = {"login": {"type": "slurm", "env": {"FROM_BACKEND": "b", "BOTH": "backend"}},
                "other": {"type": "local"}}
    settings = CloudTik(config=Config({"HPC": {"backends": backends}}),
                        state_dir=str(state_dir))
    return SlurmNodeProvider({"type": "slurm", "scheduler": "job", **provider}, "svc",
                             ProviderContext(state_dir, Store(state_dir), settings))


def test_a_named_backend_is_the_login_node_with_the_providers_env_over_its_own(state_dir):
    prov = _provider(state_dir, {"backend": "login", "env": {"BOTH": "provider"}})
    login = prov.login
    assert isinstance(login, SlurmLogin) and not login.remote
    r = login.slurm(["sh", "-c", 'echo "$FROM_BACKEND/$BOTH"'], "sh")
    assert (r.rc, r.stdout.strip()) == (0, "b/provider")
    assert prov.login is login  # opened once, kept


def test_slurm_that_cannot_be_reached_is_unavailable_not_a_refusal(state_dir):
    login = _provider(state_dir, {"backend": "login"}).login
    with pytest.raises(BackendUnavailable, match="squeue: Unable to contact slurm"):
        login.slurm(["sh", "-c", "echo 'Unable to contact slurm controller' >&2; exit 1"],
                    "squeue")
    r = login.slurm(["sh", "-c", "echo 'Invalid job id' >&2; exit 1"], "scancel")
    assert (r.rc, r.message) == (1, "Invalid job id")  # Slurm answered: the caller decides


def test_a_backend_that_is_not_a_configured_slurm_one_names_the_field(state_dir):
    for name in ("nope", "other"):
        with pytest.raises(ConfigError) as e:
            _ = _provider(state_dir, {"backend": name}).login
        assert e.value.field == "provider.backend"
        assert str(e.value) == (f"provider.backend: '{name}' is not a configured HPC backend "
                                "of type slurm (slurm backends: login)")


def test_a_service_no_feature_offers_is_refused():
    assert callable(features.feature_service("slurm_login"))
    with pytest.raises(ConfigError, match="service 'no_such': no installed feature offers it"):
        features.feature_service("no_such")
