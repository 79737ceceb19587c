"""The one argument parser every face uses: ``%cluster``, ``%storage``, ``%hpc``,
``%sidekick`` and ``jupyter cloudtik`` with its features' sub-commands.

A magic must not print usage and exit the kernel, so bad input raises ``UsageProblem``
(one line with the usage) and each face shows it its own way.  It sits in core because
every feature's commands share it and none may import another feature for it.
"""

from __future__ import annotations

import argparse
from typing import NoReturn


class UsageProblem(Exception):
    """Bad sub-command or option; the message includes the usage line."""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser that raises instead of printing and exiting (magics need that)."""

    def error(self, message: str) -> NoReturn:
        raise UsageProblem(f"{self.format_usage().strip()}\n{self.prog}: {message}")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if status:
            raise UsageProblem(message or "")
        raise SystemExit(0)
