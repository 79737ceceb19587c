"""``HubClient``: the sidekick's own calls (side-kicks, catalogue, egress) for notebooks and
terminals of a hub user.

In a kernel of a delegating single-user server the calls go to that server
(``CLOUDTIK_API_URL``), which passes them on; in a terminal of the same server they go
straight to the sidekick (``CLOUDTIK_HUB_SERVICE_URL`` with the server's
``JUPYTERHUB_API_TOKEN``).  Either way the sidekick sees the hub user.
"""

from __future__ import annotations

import os
from typing import Any

from ..api.client import RestClient, _seg
from ..clusters.client import API_URL_ENV
from ..core import env
from ..core.errors import ConfigError


class HubClient:
    def __init__(self, rest: RestClient) -> None:
        self.rest = rest

    @classmethod
    def from_environment(cls) -> HubClient:
        if os.environ.get(API_URL_ENV):
            return cls(RestClient.from_environment())
        service = os.environ.get(env.HUB_SERVICE_URL)
        token = os.environ.get("JUPYTERHUB_API_TOKEN")
        if service and token:
            return cls(RestClient(service.rstrip("/") + "/cloudtik/api/", token))
        raise ConfigError(
            "no hub sidekick here: side-kicks, the catalogue and egress rules are offered by "
            f"a JupyterHub's cloudtik service ({env.HUB_SERVICE_URL} is not set in this session)",
            field=env.HUB_SERVICE_URL)

    def __repr__(self) -> str:
        return f"<HubClient {self.rest.url}>"

    def whoami(self) -> dict[str, Any]:
        return self.rest._json("GET", "hub/whoami")

    def catalog(self, kind: str | None = None) -> list[dict[str, Any]]:
        return self.rest._json("GET", "hub/catalog", params={"kind": kind})["resources"]

    def sidekicks(self) -> list[dict[str, Any]]:
        return self.rest._json("GET", "hub/sidekicks")["sidekicks"]

    def sidekick(self, name: str) -> dict[str, Any]:
        return self.rest._json("GET", f"hub/sidekicks/{_seg(name)}")

    def start_sidekick(self, name: str) -> dict[str, Any]:
        return self.rest._json("POST", f"hub/sidekicks/{_seg(name)}", timeout=120)

    def stop_sidekick(self, name: str) -> dict[str, Any]:
        return self.rest._json("DELETE", f"hub/sidekicks/{_seg(name)}", timeout=60)

    def sidekick_logs(self, name: str, tail: int = 200) -> str:
        return self.rest._json("GET", f"hub/sidekicks/{_seg(name)}/logs",
                               params={"tail": tail})["logs"]

    def egress_rules(self) -> list[dict[str, Any]]:
        return self.rest._json("GET", "hub/egress/rules")["rules"]

    def set_egress_rule(self, rule_id: str, *, host: str, header: str, value: str | None,
                        port: int | None = None, path_prefix: str = "/",
                        users: list[str] | None = None,
                        groups: list[str] | None = None) -> dict[str, Any]:
        body = {"host": host, "header": header, "value": value, "port": port,
                "path_prefix": path_prefix, "users": users or [], "groups": groups or []}
        return self.rest._json("PUT", f"hub/egress/rules/{_seg(rule_id)}", body=body)

    def delete_egress_rule(self, rule_id: str) -> None:
        self.rest._request("DELETE", f"hub/egress/rules/{_seg(rule_id)}")

    # consent between users (docs/hub-egress.md "Rules of one user, traffic of another")
    def egress_applies(self) -> dict[str, Any]:
        """Every rule acting on (or offered to) this user's sessions, values never shown:
        ``own``, ``shared`` (with the share's state), ``admin``, and ``applied`` ids."""
        return self.rest._json("GET", "hub/egress/applies")

    def egress_shares(self) -> list[dict[str, Any]]:
        """Rules other users offered to this user, and the answer given so far."""
        return self.rest._json("GET", "hub/egress/shares")["shares"]

    def accept_egress_share(self, rule_id: str) -> dict[str, Any]:
        return self.rest._json("POST", f"hub/egress/shares/{_seg(rule_id)}/accept")

    def decline_egress_share(self, rule_id: str) -> dict[str, Any]:
        """Decline an offer, or withdraw an acceptance given earlier."""
        return self.rest._json("POST", f"hub/egress/shares/{_seg(rule_id)}/decline")

    def revoke_egress_share(self, rule_id: str, user: str) -> dict[str, Any]:
        """The owner takes a share back from ``user``."""
        return self.rest._json("DELETE",
                               f"hub/egress/rules/{_seg(rule_id)}/shares/{_seg(user)}")
