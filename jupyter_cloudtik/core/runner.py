"""The one operation runner: launch, run with a timeout and cancel, wait, map failures.

Every manager (clusters, workspaces, storage) records a long piece of work as an
operation (``Operations.start``) and hands the coroutine that does it to its
``OperationRunner``.  The runner owns what used to be written once per manager:

* ``launch`` runs the coroutine as a task on the running loop and returns an
  ``OperationHandle`` (info, events, wait, cancel);
* the coroutine's end becomes the operation's final state: a result is ``succeeded``;
  ``OperationCancelled`` / task cancellation is ``cancelled``; a timeout is ``failed``
  with an ``OperationTimeout``; a ``CloudTikError`` is ``failed`` with that error; any
  other exception is a bug, logged with its traceback and recorded as an "internal
  error" without one (``result_of`` turns the record back into the same error class);
* ``cancel`` sets the operation's cancel flag (cooperative code stops by itself), gives
  the task ``cancel_grace`` seconds, then cancels it;
* ``wait`` follows a task of this process, or the store's events for an operation that
  another process runs.

What differs between features are hooks: ``on_failed`` / ``on_cancelled`` (mark the
cluster or workspace failed) and ``redact`` (storage removes secrets from messages).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from .errors import CloudTikError, OperationCancelled, OperationTimeout, error_from_dict
from .operations import Event, OperationInfo, Operations

log = logging.getLogger("jupyter_cloudtik")


def result_of(op: OperationInfo) -> Any:
    """The result of a finished operation, or the error it ended with (raised)."""
    if op.state == "succeeded":
        return op.result
    if op.state == "cancelled":
        raise OperationCancelled(f"{op.kind} {op.target} was cancelled")
    err = (op.result or {}).get("error") if isinstance(op.result, dict) else None
    raise error_from_dict(err or {"message": op.reason or "failed"})


class OperationHandle:
    """A running (or finished) operation: watch its events, wait for it, cancel it."""

    def __init__(self, runner: OperationRunner, op_id: str,
                 task: asyncio.Task | None = None) -> None:
        self.runner = runner
        self.op_id = op_id
        self.task = task

    @property
    def info(self) -> OperationInfo:
        return self.runner.ops.get(self.op_id)

    def events(self, after: int = 0) -> AsyncIterator[Event]:
        return self.runner.ops.watch(self.op_id, after=after)

    async def wait(self) -> Any:
        return await self.runner.wait(self.op_id)

    async def cancel(self) -> OperationInfo:
        return await self.runner.cancel(self.op_id)


class OperationRunner:
    """Runs the operations of one manager (see the module docstring)."""

    def __init__(
        self,
        ops: Operations,
        *,
        timeout: Callable[[], float | None] | None = None,
        cancel_grace: float = 0.0,
        on_failed: Callable[[OperationInfo, CloudTikError], None] | None = None,
        on_cancelled: Callable[[OperationInfo], None] | None = None,
        redact: Callable[[str], str] | None = None,
        what: str = "operation",
    ) -> None:
        self.ops = ops
        self._timeout = timeout or (lambda: None)
        self.cancel_grace = cancel_grace
        self.on_failed = on_failed
        self.on_cancelled = on_cancelled
        self.redact = redact or (lambda text: text)
        self.what = what
        self.tasks: dict[str, asyncio.Task] = {}

    # launching ------------------------------------------------------------------------
    def launch(self, op: OperationInfo, coro: Awaitable[Any]) -> OperationHandle:
        task = asyncio.get_running_loop().create_task(self._run(op, coro))
        self.tasks[op.id] = task
        task.add_done_callback(lambda _t, op_id=op.id: self.tasks.pop(op_id, None))
        return OperationHandle(self, op.id, task)

    def handle(self, op_id: str) -> OperationHandle:
        """A handle on an operation that exists (its task when this process runs it)."""
        return OperationHandle(self, op_id, self.tasks.get(op_id))

    def runs(self, op_id: str) -> bool:
        """Does this process run ``op_id`` right now?"""
        return op_id in self.tasks

    async def _run(self, op: OperationInfo, coro: Awaitable[Any]) -> Any:
        timeout = self._timeout()
        try:
            result = await (asyncio.wait_for(coro, timeout) if timeout else coro)
        except (OperationCancelled, asyncio.CancelledError):
            self.ops.finish(op.id, "cancelled", reason="cancelled by request",
                            result={"error": OperationCancelled("cancelled").to_dict()})
            if self.on_cancelled is not None:
                self.on_cancelled(op)
            return None
        except (asyncio.TimeoutError, OperationTimeout) as e:
            self._fail(op, e if isinstance(e, OperationTimeout) else OperationTimeout(
                f"{op.kind} did not finish within {timeout:.0f}s "
                "(c.CloudTik.operation_timeout)"))
            return None
        except CloudTikError as e:
            self._fail(op, e)
            return None
        except Exception as e:  # a bug or an unexpected failure: say so without a traceback
            log.exception("%s %s (%s) failed", self.what, op.id, op.kind)
            self._fail(op, CloudTikError(f"internal error: {type(e).__name__}: {e}"))
            return None
        self.ops.finish(op.id, "succeeded", result=result)
        return result

    def _fail(self, op: OperationInfo, err: CloudTikError) -> None:
        err.message = self.redact(err.message)
        self.ops.finish(op.id, "failed", reason=err.message, result={"error": err.to_dict()})
        if self.on_failed is not None:
            self.on_failed(op, err)

    # waiting and cancelling ---------------------------------------------------------
    async def wait(self, op_id: str, poll: float = 0.1) -> Any:
        """The result of an operation; raises its error if it failed or was cancelled."""
        task = self.tasks.get(op_id)
        if task is not None:
            await asyncio.shield(task)
        else:
            async for _ in self.ops.watch(op_id, poll_interval=poll):
                pass
        return result_of(self.ops.get(op_id))

    async def cancel(self, op_id: str) -> OperationInfo:
        """Ask the operation to stop; a task of this process gets ``cancel_grace`` seconds
        to stop by itself (it sees the flag), then is cancelled."""
        op_id = self.ops.request_cancel(op_id).id
        task = self.tasks.get(op_id)
        if task is not None and not task.done():
            if self.cancel_grace > 0:
                with contextlib.suppress(asyncio.TimeoutError, BaseException):
                    await asyncio.wait_for(asyncio.shield(task), self.cancel_grace)
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await asyncio.shield(task)
        return self.ops.get(op_id)
