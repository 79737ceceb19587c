"""Our errors in IPython: one line, said once.

A ``CloudTikError`` is a message for a person (the field, the value, what to do): a
traceback of our internals around it hides it.  IPython's ``set_custom_exc`` shows it as
``NodeLaunchError: ...`` with a pointer to ``%tb``, as IPython shows its own
``UsageError``.  Installed only when no other extension holds that hook (it has one slot).
"""

from __future__ import annotations

import sys
from typing import Any

from .core.errors import CloudTikError


def _show(shell: Any, etype: type, value: BaseException, tb: Any,
          tb_offset: int | None = None) -> None:
    message = getattr(value, "message", None) or str(value)
    print(f"{etype.__name__}: {message}\n(%tb shows where it came from)", file=sys.stderr)


def install(shell: Any) -> None:
    if getattr(shell, "custom_exceptions", ()) not in ((), (CloudTikError,)):
        return  # another extension's handler: leave it
    shell.set_custom_exc((CloudTikError,), _show)
