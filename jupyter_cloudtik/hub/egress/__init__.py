"""The sidekick's egress proxy: sessions' outbound HTTP(S) gets credentials added by rule,
so a session can use a secret (even an anonymous session, if the owner allows) without
ever seeing it.  See docs/hub-egress.md.

``EgressSupervisor`` runs the proxy as a child process and feeds it its config over a pipe;
``Rule``/``RuleSet`` are the rules; ``DeploymentCA`` is the CA sessions trust for interception.
"""

from __future__ import annotations

from .ca import DeploymentCA
from .rules import Rule, RuleSet

__all__ = ["DeploymentCA", "EgressSupervisor", "Rule", "RuleSet"]


def __getattr__(name: str):
    # the supervisor pulls in asyncio subprocess machinery: only when asked for
    if name == "EgressSupervisor":
        # deferred: start-up (hub.egress.supervisor ~58 ms, loads asyncio, psutil)
        from .supervisor import EgressSupervisor

        return EgressSupervisor
    raise AttributeError(name)
