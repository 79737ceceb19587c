"""Who a core call acts for, when one process serves many people.

A notebook, the CLI or a single-user Jupyter server act for the user running them: the
managers record ``getpass.getuser()``.  The hub sidekick serves every hub user from one
process and one set of managers, so each request sets the acting caller for the duration
of its call: a ``ContextVar``, so it follows the request into the asyncio tasks the call
starts (an operation keeps the owner it was started for) and never leaks between requests.
The caller carries the groups and admin flag the access policy (``core/grants.py``)
decides on, not only a name.
"""

from __future__ import annotations

import getpass
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

acting_user: ContextVar[str | None] = ContextVar("cloudtik_acting_user", default=None)
acting_caller: ContextVar[Caller | None] = ContextVar("cloudtik_acting_caller", default=None)


#: in a grant's users or groups: everybody
EVERYONE = "*"


@dataclass(frozen=True)
class Caller:
    """Who a request acts for: a name, their groups, admin or not."""

    name: str
    groups: tuple[str, ...] = ()
    admin: bool = False

    def may_use(self, users: list[str], groups: list[str]) -> bool:
        if self.admin or EVERYONE in users or EVERYONE in groups or self.name in users:
            return True
        return any(g in groups for g in self.groups)


def os_user() -> str:
    """The account this process runs as: who a notebook, the CLI or a single-user server
    acts for.  "unknown" where the account has no passwd entry (some containers), since
    the managers must still start there."""
    try:
        return getpass.getuser()
    except Exception:
        return "unknown"


def effective_user(default: str) -> str:
    """The user this call acts for: the request's (hub) or the process's own."""
    return acting_user.get() or default


def current_caller(default: str) -> Caller:
    """The caller this call acts for: the request's, else the process's own user."""
    caller = acting_caller.get()
    if caller is not None:
        return caller
    return Caller(effective_user(default))


@contextmanager
def acting_as(who: str | Caller) -> Iterator[None]:
    caller = who if isinstance(who, Caller) else Caller(who)
    token = acting_user.set(caller.name)
    ctoken = acting_caller.set(caller)
    try:
        yield
    finally:
        acting_caller.reset(ctoken)
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

    @property
    def caller(self) -> Caller:
        return current_caller(self._own_user)
