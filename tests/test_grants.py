"""The one policy point (``core/grants.py``) and the only way to a secret (issue 26).

Two kinds of check: what the code *can* do (a scan of every module of the package: no
secret is read but through ``SecretStore.reveal`` against a grant, the service's own uses
are a short, named list), and what the policies decide, on real state databases.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from ast_parse import parse

import jupyter_cloudtik
from jupyter_cloudtik.core.errors import NotFoundError, PermissionDeniedError
from jupyter_cloudtik.core.grants import SERVICE, Caller, Grant, OwnerPolicy, policy_for
from jupyter_cloudtik.core.secrets import SecretStore
from jupyter_cloudtik.core.store import Store

PACKAGE = Path(jupyter_cloudtik.__file__).parent
#: the secret store itself, and the policies that mint grants
OWNERS = {"core/secrets.py", "core/grants.py", "hub/policy.py"}
#: every use of a secret by the service itself (values that never leave the process),
#: by module and kind; a new one is a decision to review, not a line to add in passing
SERVICE_USES = {
    ("hpc/base.py", "hpc"),                          # the backend talks to its system
    ("providers/dask_gateway.py", "gateway"),        # logs in to the gateway
    ("providers/huaweicloud/credentials.py", "workspace"),  # calls the cloud's API
    ("hub/egress_consent.py", "egress"),               # feeds the egress proxy process
    ("placement/zones.py", "zone"),                  # authenticates to a child zone
}
PRIVATE = {"_read", "_read_all", "_fernet", "_keys", "_file_keys", "_explicit_key",
           "_write_keys", "_reencrypt"}
#: Fernet for something else than the secret store: zones seal placement hints with a key
#: of their own (``zone.key``), which opens no secret
OWN_CRYPTO = {"placement/zones.py"}


def _names(node: ast.AST) -> str:
    """The dotted text of an expression like ``self.hub.secrets`` (for the scan)."""
    if isinstance(node, ast.Attribute):
        return f"{_names(node.value)}.{node.attr}"
    return getattr(node, "id", "")


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        yield rel, parse(path.read_text(), rel)


def test_no_module_reads_a_secret_but_through_a_grant():
    problems = []
    service_uses = set()
    for rel, tree in _modules():
        for node in ast.walk(tree):
            if rel in OWNERS:
                continue
            if isinstance(node, ast.Attribute) and node.attr in PRIVATE and \
                    "secret" in _names(node.value).lower():
                problems.append(f"{rel}:{node.lineno}: .{node.attr} (the store's insides)")
            if isinstance(node, ast.Attribute) and node.attr in ("get_all", "get") and \
                    isinstance(node.value, ast.Attribute) and node.value.attr == "secrets":
                problems.append(f"{rel}:{node.lineno}: secrets.{node.attr} (no such way)")
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = " ".join(node.value.split()).upper()
                if any(w in text for w in ("FROM SECRETS", "INTO SECRETS", "UPDATE SECRETS",
                                           "JOIN SECRETS")):
                    problems.append(f"{rel}:{node.lineno}: SQL on the secrets table")
                if node.value == "secret.key":
                    problems.append(f"{rel}:{node.lineno}: the key file's name")
            if isinstance(node, ast.ImportFrom) and node.module and \
                    node.module.startswith("cryptography.fernet") and rel not in OWN_CRYPTO:
                problems.append(f"{rel}:{node.lineno}: Fernet outside the secret store")
            if isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
                if name in ("Grant", "_mint"):
                    problems.append(f"{rel}:{node.lineno}: {name}() outside a policy")
                if name == "service" and isinstance(f, ast.Attribute) and node.args:
                    kind = node.args[0]
                    purpose = node.args[2] if len(node.args) > 2 else None
                    if not (isinstance(kind, ast.Constant) and isinstance(purpose, ast.Constant)
                            and isinstance(purpose.value, str) and purpose.value):
                        problems.append(f"{rel}:{node.lineno}: a service grant without a "
                                        "literal kind and purpose")
                    else:
                        service_uses.add((rel, kind.value))
    assert not problems, "\n".join(problems)
    assert service_uses == SERVICE_USES


def test_a_grant_is_made_by_a_policy_only(tmp_path):
    store = Store(tmp_path)
    secrets = SecretStore(store)
    secrets.put("storage:x", "pass", "the-password")
    with pytest.raises(TypeError):
        Grant(Caller("eve"), "storage", "x", "read", "storage:x")
    forged = object.__new__(Grant)  # past __init__ and its check: still no seal
    for k, v in {"caller": Caller("eve"), "kind": "storage", "name": "x", "mode": "read",
                 "scope": "storage:x", "purpose": "", "detail": {}, "_seal": None}.items():
        object.__setattr__(forged, k, v)
    for not_a_grant in (forged, ("storage:x", "pass"), "storage:x", None):
        with pytest.raises(PermissionDeniedError) as e:
            secrets.reveal(not_a_grant)
        assert e.value.field == "grant" and "the-password" not in e.value.message
    # a grant opens its own item's scope only, whatever is asked
    grant = OwnerPolicy(store).service("zone", "child", "the test")
    assert secrets.reveal(grant) == {}


def test_a_single_persons_policy_grants_their_own_items_in_the_right_mode(tmp_path):
    from jupyter_cloudtik.storage.manager import StorageManager

    manager = StorageManager(store=Store(tmp_path), supervise=False)
    manager.add("ro", "webdav", {"url": "http://127.0.0.1:9", "pass": "pw-ro"},
                read_only=True)
    manager.add("rw", "webdav", {"url": "http://127.0.0.1:9", "pass": "pw-rw"},
                read_only=False)
    policy = policy_for(manager.store)
    assert isinstance(policy, OwnerPolicy)
    me = Caller("me")
    assert policy.grant(me, "storage", "rw", "write").mode == "write"
    with pytest.raises(PermissionDeniedError) as e:
        policy.grant(me, "storage", "ro", "write", field="dst")
    assert e.value.field == "dst" and "read-only" in e.value.message
    with pytest.raises(NotFoundError) as e:
        policy.grant(me, "storage", "nope", "read", field="src")
    assert e.value.field == "src"
    # the owner's own nodes may hold the owner's own credential, even of a read-only one
    grant = policy.grant(me, "storage", "ro", "read")
    assert policy.node_secrets(grant, manager.secrets)["pass"] == "pw-ro"
    assert SERVICE.admin and policy.service("zone", "z", "why").for_service


def test_only_storage_reads_its_tables():
    """Who may use a storage is decided on what the storage feature says exists (its index,
    through the registry); no other module reads its tables with SQL of its own."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "jupyter_cloudtik"
    sql = re.compile(r"\b(FROM|JOIN|INTO|UPDATE)\s+(storages|storage_mounts)\b", re.I)
    found = [f"{p.relative_to(root)}" for p in root.rglob("*.py")
             if p.relative_to(root).parts[0] != "storage" and sql.search(p.read_text())]
    assert found == [], found
