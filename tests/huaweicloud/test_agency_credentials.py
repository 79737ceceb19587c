"""The metadata service's temporary agency credentials and OBS's checks of them.

The whole path (a node fetching its TLS certificate from OBS with them) runs in every
cluster ``up`` of the emulator (test_lifecycle.py); these are the refusals.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import tornado.web

from cloudtik_emulators.huaweicloud.agency_credentials import (
    check_temporary_credential,
    issue_temporary_credential,
)
from cloudtik_emulators.huaweicloud.errors import ApiError


def test_temporary_credentials_need_their_token_and_expire():
    emu = SimpleNamespace(temporary_credentials={})
    server = {"id": "s1", "metadata": {"agency_name": "cloudtik-w-worker"}}
    cred = issue_temporary_credential(emu, server)["credential"]
    assert set(cred) == {"access", "secret", "securitytoken", "expires_at"}
    assert issue_temporary_credential(emu, server)["credential"] == cred  # still fresh
    ak, token = cred["access"], cred["securitytoken"]
    check_temporary_credential(emu, ak, {"x-obs-security-token": token})
    check_temporary_credential(emu, "ACCOUNTKEY", {})  # the account's own key: not ours
    with pytest.raises(ApiError) as e:
        check_temporary_credential(emu, ak, {})
    assert (e.value.status, e.value.code) == (403, "AccessDenied")
    with pytest.raises(ApiError) as e:
        wrong = token[:-1] + ("y" if token.endswith("x") else "x")  # never the same token
        check_temporary_credential(emu, ak, {"x-obs-security-token": wrong})
    assert (e.value.status, e.value.code) == (403, "InvalidSecurityToken")
    emu.temporary_credentials[ak]["expires"] = time.time() - 1
    with pytest.raises(ApiError) as e:
        check_temporary_credential(emu, ak, {"x-obs-security-token": token})
    assert (e.value.status, e.value.code) == (403, "InvalidAccessKeyId")
    assert issue_temporary_credential(emu, server)["credential"]["access"] != ak  # renewed
    with pytest.raises(tornado.web.HTTPError) as e:
        issue_temporary_credential(emu, {"id": "s2", "metadata": {}})
    assert e.value.status_code == 404


def test_nodes_fetch_new_credentials_before_they_expire(hwc, core, monkeypatch):
    """Short-lived agency credentials (4 s here; 15 min to 24 h on the real cloud): the
    node's OBS reader (userdata.NODE_TOOL's ``Agency``, what fetches the TLS bundle and
    the wheels) takes new ones from the metadata service before ``expires_at``, and OBS
    refuses the old ones once expired (403 InvalidAccessKeyId)."""
    from hwc_helpers import cluster_config, workspace_config

    from jupyter_cloudtik.core import config as cfgmod
    from jupyter_cloudtik.providers.huaweicloud import HuaweiCloudNodeProvider
    from jupyter_cloudtik.providers.huaweicloud.userdata import NODE_TOOL, tls_object_key

    ws = "creds"
    winfo = core.run(core.workspaces.create(ws, workspace_config(hwc)))
    hwc.ctl.set_options(credential_seconds=4)
    try:
        core.run(core.clusters.up(cluster_config("cr", ws, workers=0)))
        (head,) = [s for s in hwc.ctl.state()["servers"]
                   if s["tags"].get("cloudtik-cluster-name") == "cr"]
        prov = HuaweiCloudNodeProvider(cfgmod.build_config(cluster_config("cr", ws))[
            "provider"], "cr", core.clusters.context)
        monkeypatch.setenv("CLOUDTIK_OBS_BUCKET", winfo.resources["bucket"])
        monkeypatch.setenv("CLOUDTIK_OBS_ENDPOINT", prov._obs_endpoint())
        monkeypatch.setenv("CLOUDTIK_OBS_PROXY", hwc.info["endpoint"])
        base = f"{hwc.info['endpoint']}/_emulator/metadata/{head['id']}"
        tool: dict = {"__name__": "node_tool"}
        exec(NODE_TOOL, tool)
        key = tls_object_key("cr")
        assert b"BEGIN CERTIFICATE" in tool["obs_get"](base, key)
        agency = tool["_AGENCIES"][base]
        first = dict(agency.cred)
        assert 0 < agency.expires - time.time() <= 4.5
        reads = 0
        deadline = time.time() + 7
        while time.time() < deadline:  # a node busy past the first credentials' end
            assert b"BEGIN CERTIFICATE" in tool["obs_get"](base, key)
            reads += 1
            time.sleep(0.25)
        assert agency.cred["access"] != first["access"], "never refreshed"
        assert reads >= 15
        # the first ones, used after their end: refused as OBS does
        stale = tool["Agency"](base)
        stale.cred, stale.expires = first, time.time() + 3600
        tool["_AGENCIES"][base] = stale
        with pytest.raises(SystemExit) as e:
            tool["obs_get"](base, key)
        assert "HTTP 403" in str(e.value) and "InvalidAccessKeyId" in str(e.value), e.value
    finally:
        hwc.ctl.set_options(credential_seconds=3600)
        core.run(core.clusters.down("cr"))
        core.run(core.workspaces.delete(ws))
