"""The extension is a jupyter_server ``ExtensionApp`` and kernels get the API through a
kernel provisioner, not through patched server methods."""

from __future__ import annotations

import os
from pathlib import Path

from jupyter_cloudtik.core import env
from jupyter_cloudtik.server.extension import CloudTikExtension
from jupyter_cloudtik.server.kernels import CloudTikProvisioner


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


def test_the_extension_is_an_extension_app_and_patches_nothing(jp_serverapp, cloudtik):
    apps = jp_serverapp.extension_manager.extension_apps["jupyter_cloudtik"]
    assert [type(app) for app in apps] == [CloudTikExtension]
    # the server's own methods are its own (no wrapper installed at run time)
    assert type(jp_serverapp).cleanup_extensions is not None
    assert "cleanup_extensions" not in vars(jp_serverapp)
    assert "start_kernel" not in vars(jp_serverapp.kernel_manager)


async def test_a_kernel_gets_the_api_url_and_its_token(jp_serverapp, cloudtik):
    km = jp_serverapp.kernel_manager
    kid = await km.start_kernel()
    try:
        kernel = km.get_kernel(kid)
        assert isinstance(kernel.provisioner, CloudTikProvisioner)
        seen = _environ(kernel.provisioner.pid)
        assert seen[env.API_TOKEN] == cloudtik.kernel_token
        assert seen[env.API_URL] == cloudtik.api_url()
        assert seen[env.API_URL].endswith(f":{jp_serverapp.port}{jp_serverapp.base_url}"
                                          "cloudtik/api/")
        # the server's own environment is left alone (terminals get nothing)
        assert env.API_TOKEN not in os.environ
    finally:
        await km.shutdown_kernel(kid, now=True)


async def test_the_stop_hook_runs_the_features_shutdown(jp_serverapp, cloudtik, monkeypatch):
    """``stop_extension`` is what the server awaits on stop: it runs every feature's
    shutdown hook with the context."""
    from jupyter_cloudtik.api import routes

    seen = []
    monkeypatch.setattr(routes, "lifecycle_hooks",
                        lambda name: [lambda ctx: seen.append((name, ctx))])
    from jupyter_cloudtik.server import extension

    monkeypatch.setattr(extension, "lifecycle_hooks", routes.lifecycle_hooks)
    (app,) = jp_serverapp.extension_manager.extension_apps["jupyter_cloudtik"]
    await jp_serverapp.extension_manager.stop_all_extensions()
    assert seen == [("shutdown", cloudtik)]
    assert app.ctx is cloudtik
