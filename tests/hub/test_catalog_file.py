"""The catalogue file an admin keeps in configuration management (c.CloudTikHub.catalog_file),
applied to a real catalogue in a real state DB."""

from __future__ import annotations

import pytest
from traitlets.config import Config, Configurable

from jupyter_cloudtik.core.errors import ConfigError, NotFoundError
from jupyter_cloudtik.hub.bootstrap import load_catalog_file
from jupyter_cloudtik.hub.catalog import Caller
from jupyter_cloudtik.hub.context import HubContext


def _ctx(tmp_path, *, text: str, **hub_settings):
    """The sidekick's real context (its catalogue, secret store, storage and job managers,
    access policy) on a state folder of its own, with the catalogue file ``text``."""
    path = tmp_path / "catalog.yaml"
    path.write_text(text)
    config = Config()
    config.CloudTik.state_dir = str(tmp_path / "state")
    config.CloudTikHub.catalog_file = str(path)
    for key, value in hub_settings.items():
        setattr(config.CloudTikHub, key, value)
    ctx = HubContext(Configurable(config=config))
    return ctx


def test_catalog_file_with_secrets_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TEST_OBS_SK", "sk-from-env-123")
    ctx = _ctx(tmp_path, allow_local_execution=True, text="""
resources:
  - kind: storage
    name: physics-data
    spec: {type: s3, options: {provider: HuaweiOBS}}
    secrets: {secret_access_key: {env: TEST_OBS_SK}}
    groups: [physics]
  - kind: provider
    name: pool
    spec: {type: local}
    users: ["*"]
quotas:
  default: {max_clusters: 2}
  group:physics: {max_clusters: 4, max_cores: 64}
""")
    load_catalog_file(ctx)
    cat = ctx.catalog
    alice, bob = Caller("alice", ("physics",)), Caller("bob", ("chemistry",))
    # the storage exists for the sidekick (a file's storage is synced as a PUT's is), and
    # its secret is released against a grant of someone who may use it
    grant = ctx.grant(alice, "storage", "physics-data")
    assert ctx.secrets.reveal(grant) == {"secret_access_key": "sk-from-env-123"}
    assert "sk-from-env-123" not in str(cat.get("storage", "physics-data").to_dict(admin=True))
    assert [r.name for r in cat.visible(alice)] == ["pool", "physics-data"]
    assert [r.name for r in cat.visible(bob)] == ["pool"]
    assert cat.quota_for(alice)["max_clusters"] == 4
    assert cat.quota_for(bob)["max_clusters"] == 2
    assert cat.audit_log()[0]["actor"] == "catalog-file"
    load_catalog_file(ctx)  # applying it again changes nothing
    assert len(cat.list()) == 2


@pytest.mark.parametrize(("text", "words"), [
    ("resources:\n  - {kind: widget, name: x}\n", ["resources[0]", "kind", "widget"]),
    ("resources:\n  - {kind: provider, name: Bad Name, spec: {type: local}}\n",
     ["resources[0]", "name", "Bad Name"]),
    ("resources:\n  - {kind: template, name: t, spec: {provider: 3}}\n",
     ["resources[0]", "spec.provider"]),
    ("resources:\n  - {kind: storage, name: s, spec: {type: s3},"
     " secrets: {key: {env: NOT_SET_ANYWHERE_42}}}\n", ["secrets.key", "NOT_SET_ANYWHERE_42"]),
    ("quotas:\n  user:alice: {max_cores: -1}\n", ["quotas.user:alice", "max_cores", "-1"]),
    ("quotas:\n  someone: {max_cores: 1}\n", ["subject", "someone"]),
    ("resources: [\n", ["cannot read"]),
])
def test_bad_catalog_files_name_the_entry_and_field(tmp_path, text, words):
    with pytest.raises(ConfigError) as info:
        load_catalog_file(_ctx(tmp_path, text=text))
    for word in words:
        assert word in info.value.message, info.value.message


def test_the_catalogue_of_docs_hub_md(tmp_path, monkeypatch):
    """docs/hub.md's catalogue file as written, its secrets from the environment it names."""
    import doc_examples

    text = doc_examples.block("docs/hub.md", "Set-up", lang="yaml").text
    for var in ("HWC_AK", "HWC_SK", "HWC_PROJECT", "OBS_SK", "OBS_RO_AK", "OBS_RO_SK"):
        monkeypatch.setenv(var, f"value-of-{var}")
    ctx = _ctx(tmp_path, text=text)
    load_catalog_file(ctx)
    cat = ctx.catalog
    physicist, chemist = Caller("alice", ("physics",)), Caller("carol", ("chemistry",))
    assert sorted(r.name for r in cat.visible(physicist)) == [
        "cluster-a", "hwc-research", "jobgw", "physics-data", "small"]
    assert sorted(r.name for r in cat.visible(chemist)) == ["hwc-research", "small"]
    grant = ctx.grant(physicist, "storage", "physics-data")
    assert ctx.secrets.reveal(grant, "secret_access_key") == "value-of-OBS_SK"
    # a node of a physicist (who may only read it) gets the read-only key, never that one
    ro = ctx.policy.node_secrets(grant, ctx.secrets)
    assert ro["secret_access_key"] == "value-of-OBS_RO_SK"
    assert ro["access_key_id"] == "value-of-OBS_RO_AK"
    assert "read_only_credentials.secret_access_key" in \
        cat.get("storage", "physics-data").to_dict(admin=True)["secrets"]
    with pytest.raises(NotFoundError):  # another group's: no grant, so no secret
        ctx.grant(chemist, "storage", "physics-data")
    # the provider's account goes to its workspace, as a PUT of the API sends it
    assert ctx.secrets.names("provider:huaweicloud:research") == [
        "access_key", "project_id", "secret_key"]
    # her own row wins; another physicist gets the group's; others the default
    assert cat.quota_for(physicist)["max_spend_per_day"] == 100
    assert cat.quota_for(Caller("bob", ("physics",)))["max_cores"] == 128
    assert cat.quota_for(chemist)["max_cores"] == 32
