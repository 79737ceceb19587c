"""Who a core call acts for, when one process serves many people.

A notebook, the CLI or a single-user Jupyter server act for the user running them: the
managers record ``getpass.getuser()``.  The hub sidekick serves every hub user from one
process and one set of managers, so each request sets ``acting_user`` for the duration of
its call: it is a ``ContextVar``, so it follows the request into the asyncio tasks the call
starts (an operation keeps the owner it was started for) and never leaks between requests.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

acting_user: ContextVar[str | None] = ContextVar("cloudtik_acting_user", default=None)


def effective_user(default: str) -> str:
    """The user this call acts for: the request's (hub) or the process's own."""
    return acting_user.get() or default


@contextmanager
def acting_as(user: str) -> Iterator[None]:
    token = acting_user.set(user)
    try:
        yield
    finally:
        acting_user.reset(token)


class ActsForUser:
    """Mixin of the managers: ``self.user`` is the acting user when one is set."""

    _own_user: str = ""

    @property
    def user(self) -> str:
        return effective_user(self._own_user)

    @user.setter
    def user(self, value: str) -> None:
        self._own_user = value
