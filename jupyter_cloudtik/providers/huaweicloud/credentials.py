"""Where the provider finds the account's access key (AK), secret key (SK) and project.

In order: the credentials stored with the workspace (given to ``workspace create``, kept in
the secret store), a named profile of the credentials file, ``c.HuaweiCloud.access_key`` /
``secret_key`` in ``jupyter_cloudtik_config.py``, the environment
(``HUAWEICLOUD_SDK_AK``, ``HUAWEICLOUD_SDK_SK``, ``HUAWEICLOUD_SDK_PROJECT_ID``), and the
``default`` profile of the credentials file (``$HUAWEICLOUD_CREDENTIALS_FILE`` or
``~/.huaweicloud/credentials``, an INI file).

Keys never go into a cluster or workspace config that is recorded, never into a node's
user data, and never into a message: ``Credentials.__repr__`` shows the source only.
"""

from __future__ import annotations

import configparser
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from traitlets import Float, Int, Unicode
from traitlets.config import Configurable

from ...core.errors import ConfigError
from ...core.grants import policy_for

if TYPE_CHECKING:
    from ...core.secrets import SecretStore

ENV_AK = "HUAWEICLOUD_SDK_AK"
ENV_SK = "HUAWEICLOUD_SDK_SK"
ENV_PROJECT = "HUAWEICLOUD_SDK_PROJECT_ID"
ENV_DOMAIN = "HUAWEICLOUD_SDK_DOMAIN_ID"
ENV_FILE = "HUAWEICLOUD_CREDENTIALS_FILE"
ENV_PROFILE = "HUAWEICLOUD_PROFILE"
SECRET_SCOPE = "provider:huaweicloud:{workspace}"


class HuaweiCloud(Configurable):
    """Settings of the huaweicloud provider (``c.HuaweiCloud.*``)."""

    access_key = Unicode("", help="Access key (AK); better kept in the environment or the "
                         "credentials file.").tag(config=True)
    secret_key = Unicode("", help="Secret key (SK).").tag(config=True)
    project_id = Unicode("", help="Project id of the region (found through IAM if empty)."
                         ).tag(config=True)
    default_workspace = Unicode("", help="Workspace used by clusters that name none (else "
                                "the only huaweicloud workspace).").tag(config=True)
    retry_attempts = Int(6, help="Tries per API call for throttling and server errors."
                         ).tag(config=True)
    retry_base_delay = Float(0.5, help="Seconds before the first retry (doubles, jittered)."
                             ).tag(config=True)
    retry_budget = Float(60.0, help="Most seconds spent waiting on retries of one call."
                         ).tag(config=True)
    job_poll_interval = Float(1.0, help="Seconds between two looks at an ECS job (grows to "
                              "5 s).").tag(config=True)
    boot_timeout = Float(900.0, help="Seconds a batch of servers may take to become ACTIVE."
                         ).tag(config=True)


@dataclass
class Credentials:
    access_key: str = field(repr=False)
    secret_key: str = field(repr=False)
    project_id: str | None = None
    domain_id: str | None = None
    source: str = ""
    extra: dict[str, str] = field(default_factory=dict)  # region, endpoint from a profile

    def __repr__(self) -> str:
        return f"Credentials(source={self.source!r}, project_id={self.project_id!r})"

    def secrets(self) -> list[str]:
        return [self.access_key, self.secret_key]


def credentials_file() -> Path:
    return Path(os.environ.get(ENV_FILE) or Path.home() / ".huaweicloud" / "credentials")


def read_profile(profile: str, path: Path | None = None) -> Credentials | None:
    path = path or credentials_file()
    if not path.is_file():
        return None
    # "key = value   # comment", as docs/huaweicloud.md writes it (and the SDK's own
    # files allow): the comment is not part of the value
    parser = configparser.ConfigParser(inline_comment_prefixes=("#", ";"))
    try:
        parser.read(path)
    except configparser.Error as e:
        raise ConfigError(f"{path}: not a valid credentials file ({e.__class__.__name__})",
                          field="provider.profile") from None
    if not parser.has_section(profile):
        return None
    sec = parser[profile]
    ak, sk = sec.get("access_key", "").strip(), sec.get("secret_key", "").strip()
    if not ak or not sk:
        raise ConfigError(f"{path} [{profile}]: access_key and secret_key are both required",
                          field="provider.profile")
    extra = {k: sec[k] for k in ("region", "endpoint") if sec.get(k)}
    return Credentials(ak, sk, sec.get("project_id") or None, sec.get("domain_id") or None,
                       source=f"{path} [{profile}]", extra=extra)


def store_workspace_credentials(secrets: SecretStore, workspace: str,
                                creds: dict[str, Any]) -> None:
    scope = SECRET_SCOPE.format(workspace=workspace)
    for key in ("access_key", "secret_key", "project_id", "domain_id"):
        if creds.get(key):
            secrets.put(scope, key, str(creds[key]))


def resolve(provider_config: dict[str, Any], settings: HuaweiCloud,
            secrets: SecretStore | None = None, workspace: str | None = None) -> Credentials:
    """The credentials to use, or a ConfigError saying every way to give them."""
    profile = provider_config.get("profile")
    if workspace and secrets is not None:
        scope = SECRET_SCOPE.format(workspace=workspace)
        if secrets.has(scope, "access_key") and not profile:
            values = secrets.reveal(policy_for(secrets.store).service(
                "workspace", f"huaweicloud:{workspace}",
                "call Huawei Cloud's API for the workspace's clusters"))
            return Credentials(values["access_key"], values["secret_key"],
                               values.get("project_id"), values.get("domain_id"),
                               source=f"secret store (workspace {workspace})")
    if profile:
        found = read_profile(profile)
        if found is None:
            raise ConfigError(f"provider.profile: no profile [{profile}] with credentials in "
                              f"{credentials_file()}", field="provider.profile")
        return found
    if settings.access_key and settings.secret_key:
        return Credentials(settings.access_key, settings.secret_key,
                           settings.project_id or None, source="c.HuaweiCloud settings")
    ak, sk = os.environ.get(ENV_AK), os.environ.get(ENV_SK)
    if ak and sk:
        return Credentials(ak, sk, os.environ.get(ENV_PROJECT) or None,
                           os.environ.get(ENV_DOMAIN) or None, source="environment")
    found = read_profile(os.environ.get(ENV_PROFILE) or "default")
    if found is not None:
        return found
    raise ConfigError(
        "provider: no Huawei Cloud credentials found; set HUAWEICLOUD_SDK_AK and "
        f"HUAWEICLOUD_SDK_SK, write them to {credentials_file()} ([default] access_key = ..., "
        f"secret_key = ...; {ENV_FILE} names another file), or give them once to "
        "`workspace create` (kept in the secret store). The process that runs clusters reads "
        "them: under JupyterLab that is the Jupyter server, so set them where it starts (a "
        "kernel's environment does not reach it)",
        field="provider",
    )
