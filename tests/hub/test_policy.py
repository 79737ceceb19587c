"""The hub's access policy (``hub/policy.py``) on the sidekick's real context: what each
caller is granted, and that "not yours" is exactly "no such item" for every kind."""

from __future__ import annotations

import pytest
from traitlets.config import Config, Configurable

from jupyter_cloudtik.core.errors import NotFoundError, PermissionDeniedError
from jupyter_cloudtik.core.grants import Caller, policy_for
from jupyter_cloudtik.hub.bootstrap import apply_resource
from jupyter_cloudtik.hub.context import HubContext

ALICE = Caller("alice", ("physics",))
BOB = Caller("bob", ("chemistry",))
ADMIN = Caller("admin", (), admin=True)


@pytest.fixture
def ctx(tmp_path):
    config = Config()
    config.CloudTik.state_dir = str(tmp_path / "state")
    ctx = HubContext(Configurable(config=config))
    for kind, name, body in (
            ("provider", "hwc", {"spec": {"type": "huaweicloud", "config": {
                "region": "cn-north-4", "workspace_name": "w"}, "images": ["img-ok"]},
                "secrets": {"access_key": "AK", "secret_key": "SK"},
                "groups": ["physics"]}),
            ("provider", "hwc-any", {"spec": {"type": "huaweicloud", "config": {
                "region": "cn-north-4", "workspace_name": "w"}, "images": ["*"]},
                "groups": ["chemistry"]}),
            ("template", "small", {"spec": {"provider": "hwc"}, "groups": ["physics"]}),
            ("storage", "data", {"spec": {"type": "webdav", "options": {
                "url": "http://127.0.0.1:9"}, "read_only": True},
                "secrets": {"pass": "pw"}, "groups": ["physics"]}),
            ("sidekick", "gw", {"spec": {"command": ["true"]}, "groups": ["physics"]})):
        apply_resource(ctx, ADMIN, kind, name, body)
    return ctx


KIND_NAMES = [("provider", "hwc"), ("template", "small"), ("storage", "data"),
              ("sidekick", "gw"), ("image", "hwc/img-ok")]


@pytest.mark.parametrize(("kind", "name"), KIND_NAMES)
def test_not_yours_is_no_such_item_for_every_kind(ctx, kind, name):
    assert ctx.grant(ALICE, kind, name).kind == kind
    assert ctx.grant(ADMIN, kind, name).kind == kind
    with pytest.raises(NotFoundError) as theirs:
        ctx.grant(BOB, kind, name, field="f")
    with pytest.raises(NotFoundError) as missing:
        ctx.grant(BOB, kind, name + "x", field="f")
    assert theirs.value.field == missing.value.field == "f"
    shown = name.split("/")[-1]
    assert theirs.value.message.replace(shown, "N") == \
        missing.value.message.replace(shown + "x", "N")


def test_images_are_those_the_provider_lists(ctx):
    assert ctx.grant(ALICE, "image", "hwc/img-ok")
    with pytest.raises(NotFoundError):
        ctx.grant(ALICE, "image", "hwc/img-other")       # not listed by the admin
    with pytest.raises(NotFoundError):
        ctx.grant(ALICE, "image", "hwc-any/anything")    # a provider she may not use
    assert ctx.grant(BOB, "image", "hwc-any/anything")   # "*": any image of his provider


def test_read_only_storages_and_the_services_own_kinds(ctx):
    with pytest.raises(PermissionDeniedError) as e:
        ctx.grant(ALICE, "storage", "data", "write", field="dst")
    assert e.value.field == "dst"
    with pytest.raises(PermissionDeniedError):
        ctx.grant(ADMIN, "storage", "data", "write")     # read-only is read-only for all
    # a node of a reader: no read-only credential was given, so nothing, with the fix
    grant = ctx.grant(ALICE, "storage", "data", "read")
    with pytest.raises(PermissionDeniedError) as e:
        ctx.policy.node_secrets(grant, ctx.secrets)
    assert "read_only_credentials" in e.value.message
    # users are never granted what the service uses itself
    for kind, name in (("egress", "admin/x"), ("workspace", "huaweicloud:w"),
                       ("gateway", "g"), ("zone", "z")):
        with pytest.raises(NotFoundError):
            ctx.grant(ALICE, kind, name)
        assert ctx.grant(ADMIN, kind, name).kind == kind


def test_a_background_action_acts_with_the_owners_last_groups(ctx):
    policy = policy_for(ctx.store)
    assert policy is ctx.policy
    assert policy.caller("alice") == Caller("alice")     # never seen: in no group
    ctx.remember(ALICE)
    assert policy.caller("alice") == ALICE
    assert policy.grant(policy.caller("alice"), "storage", "data", "read")
    ctx.remember(Caller("alice", ("chemistry",)))        # she moved group
    with pytest.raises(NotFoundError):
        policy.grant(policy.caller("alice"), "storage", "data", "read")
