"""``%sidekick``: start and stop the hub's side-kick services from a notebook."""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class

from ..core.arguments import UsageProblem
from ..core.errors import CloudTikError
from ..magic_line import parse_magic_line
from .commands import run_sidekick, sidekick_parser


@magics_class
class SidekickMagics(Magics):
    @line_magic
    def sidekick(self, line: str) -> Any:
        """Side-kick services of the JupyterHub cloudtik sidekick.

        Sub-commands::

          %sidekick list              what you may start, and the state of yours
          %sidekick start NAME        start it; returns once it passes its health check
          %sidekick stop NAME         stop it
          %sidekick status NAME       state, restarts, last health check
          %sidekick logs NAME [--tail N]
          %sidekick egress            egress rules acting on your sessions, offers included
                                      (you answer offers and change rules on the
                                      sidekick's page {hub}/services/cloudtik/egress, in
                                      your own browser: no token may give your consent)
        """
        # deferred: start-up (hub.client ~102 ms, loads requests, urllib3)
        from .client import HubClient

        args = parse_magic_line("%sidekick", sidekick_parser("%sidekick"), line)
        if args is None:  # help was printed
            return None
        try:
            text, value = run_sidekick(HubClient.from_environment(), args)
        except UsageProblem as e:
            raise UsageError(str(e)) from None
        except CloudTikError as e:
            raise UsageError(e.message) from None
        print(text)
        return value if args.action in ("start", "status", "egress") else None
