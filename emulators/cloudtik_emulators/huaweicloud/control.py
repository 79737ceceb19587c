"""A small client for the emulator's admin API (faults, quotas, state, request log).

Used by the tests and by ``jupyter cloudtik emulator huaweicloud status``; it talks plain
HTTP with the admin token the emulator wrote to ``emulator.json``.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any


class EmulatorControl:
    def __init__(self, endpoint: str, admin_token: str) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.token = admin_token

    @classmethod
    def from_dir(cls, root: str | Path) -> EmulatorControl:
        info = json.loads((Path(root) / "emulator.json").read_text())
        return cls(info["endpoint"], info["admin_token"])

    def _call(self, method: str, what: str, body: Any = None, query: str = "") -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"{self.endpoint}/_emulator/{what}{query}", data=data,
                                     method=method,
                                     headers={"X-Emulator-Token": self.token,
                                              "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")
            raise RuntimeError(f"emulator {method} {what}: HTTP {e.code} {detail}") from None

    def state(self) -> dict[str, Any]:
        return self._call("GET", "state")

    def requests(self, after: int = 0) -> list[dict[str, Any]]:
        return self._call("GET", "requests", query=f"?after={after}")["requests"]

    def last_request(self) -> int:
        return self._call("GET", "requests", query="?after=999999999")["last"]

    def clear_requests(self) -> None:
        self._call("DELETE", "requests")

    def inject(self, action: str, kind: str, times: int = 1, after: int = 0,
               status: int = 500, delay: float = 0.0) -> None:
        self._call("POST", "faults", {"action": action, "kind": kind, "times": times,
                                      "after": after, "status": status, "delay": delay})

    def faults(self) -> list[dict[str, Any]]:
        return self._call("GET", "faults")["faults"]

    def clear_faults(self) -> None:
        self._call("DELETE", "faults")

    def set_options(self, **options: Any) -> None:
        self._call("POST", "options", options)

    def crash(self, server_id: str, status: str = "ERROR") -> None:
        self._call("POST", "crash", {"server_id": server_id, "status": status})

    def shutdown(self) -> None:
        self._call("POST", "shutdown", {})

    def leftovers(self, state: dict[str, Any] | None = None,
                  prefix: str = "") -> dict[str, list[str]]:
        """Resources that still exist (optionally only those whose name starts with prefix)."""
        state = state or self.state()
        out: dict[str, list[str]] = {}
        for kind in ("servers", "vpcs", "subnets", "security_groups", "publicips",
                     "nat_gateways", "snat_rules", "peerings", "agencies", "keypairs",
                     "buckets", "policies"):
            names = [r.get("name") or r.get("alias") or r.get("id") or "" for r in state[kind]]
            if prefix:
                names = [n for n in names if prefix in (n or "")]
            if names:
                out[kind] = names
        return out
