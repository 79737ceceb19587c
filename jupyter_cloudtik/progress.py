"""Showing an operation's events: a widget bar in notebooks, text or rich bars elsewhere.

Every view consumes the same events (step, message, fraction), so the notebook, the CLI and
the side panel show the same thing.  ``follow`` drives any view from a backend and turns
Ctrl-C / "interrupt kernel" into a cancellation of the operation.
"""

from __future__ import annotations

import html
import sys
import time
from typing import Any, Protocol, TextIO

from .core import env
from .core.errors import OperationCancelled
from .core.operations import Event


class ProgressView(Protocol):
    def update(self, event: Event) -> None: ...
    def close(self, state: str, message: str = "") -> None: ...


class NullProgress:
    def update(self, event: Event) -> None:
        pass

    def close(self, state: str, message: str = "") -> None:
        pass


class TextProgress:
    """One line per event; used in terminals, logs and notebooks without widgets."""

    def __init__(self, title: str, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout
        self.title = title
        self._last = None
        self.start = time.monotonic()

    def update(self, event: Event) -> None:
        line = (event.step, event.message)
        # the failure is the error the caller raises and the warnings are printed as
        # WARNING lines (clusters/api.py show_warnings): each is said once
        if line == self._last or event.step in ("start", "succeeded", "failed", "warning"):
            return
        self._last = line
        pct = f"{event.fraction * 100:3.0f}%" if event.fraction is not None else "    "
        print(f"[{pct}] {event.step}: {event.message}", file=self.stream, flush=True)

    def close(self, state: str, message: str = "") -> None:
        took = time.monotonic() - self.start
        if state == "succeeded":
            print(f"{self.title}: done in {took:.1f}s", file=self.stream, flush=True)


class WidgetProgress:
    """One compact live widget per operation, as the best Dask tools draw it: the title, a
    bar, the current step and the time so far (ticking) on one line, and every message
    behind a details toggle.  A failure is said by the error the caller raises, so the
    widget only turns red and keeps the message in its details."""

    TICK_SECONDS = 1.0
    MAX_MESSAGES = 200

    def __init__(self, title: str) -> None:
        import threading

        import ipywidgets as w
        from IPython.display import display

        self.title = title
        self.start = time.monotonic()
        self.bar = w.FloatProgress(value=0.0, min=0.0, max=1.0, bar_style="info",
                                   layout=w.Layout(width="240px"))
        self.label = w.HTML(value=f"<b>{html.escape(title)}</b>")
        self.step = w.HTML(value="starting…")
        self.elapsed = w.HTML(value="0s")
        self.toggle = w.ToggleButton(value=False, description="details", icon="list",
                                     tooltip="every step of this operation",
                                     layout=w.Layout(width="90px"))
        self.log = w.HTML(value="", layout=w.Layout(display="none"))
        self.messages: list[str] = []
        self.toggle.observe(self._show_details, names="value")
        self.box = w.VBox([w.HBox([self.label, self.bar, self.step, self.elapsed,
                                   self.toggle]), self.log])
        self.box.add_class("cloudtik-progress")
        self._done = threading.Event()
        self._ticker = threading.Thread(target=self._tick, name="cloudtik-progress",
                                        daemon=True)
        display(self.box)
        self._ticker.start()

    def _show_details(self, change: dict[str, Any]) -> None:
        self.log.layout.display = "" if change["new"] else "none"

    def _tick(self) -> None:
        while not self._done.wait(self.TICK_SECONDS):
            self.elapsed.value = _seconds(time.monotonic() - self.start)

    def update(self, event: Event) -> None:
        if event.fraction is not None:
            self.bar.value = event.fraction
        if event.step in ("start", "failed"):
            return
        self.step.value = f"{html.escape(event.step)}: {html.escape(event.message)}"
        self.messages = [*self.messages, f"{event.step}: {event.message}"][
            -self.MAX_MESSAGES:]
        self.log.value = "<br>".join(f"<small>{html.escape(m)}</small>"
                                     for m in self.messages)
        self.elapsed.value = _seconds(time.monotonic() - self.start)

    def close(self, state: str, message: str = "") -> None:
        self._done.set()
        took = time.monotonic() - self.start
        self.elapsed.value = _seconds(took)
        self.bar.bar_style = {"succeeded": "success", "cancelled": "warning"}.get(
            state, "danger")
        if state == "succeeded":
            self.bar.value = 1.0
            self.step.value = "done"
            return
        self.step.value = f"<b>{html.escape(state)}</b>"
        if message:
            self.messages = [*self.messages, f"{state}: {message}"][-self.MAX_MESSAGES:]
            self.log.value = "<br>".join(f"<small>{html.escape(m)}</small>"
                                         for m in self.messages)


def _seconds(took: float) -> str:
    return f"{took:.0f}s" if took < 60 else f"{int(took // 60)}m {int(took % 60):02d}s"


class RichProgress:
    """A live bar for the CLI (stderr, so ``--json`` output on stdout stays clean)."""

    def __init__(self, title: str) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = Console(stderr=True)
        self.progress = Progress(
            TextColumn("[bold]{task.fields[title]}"), BarColumn(),
            TextColumn("{task.percentage:>3.0f}%"), TimeElapsedColumn(),
            TextColumn("{task.description}"), console=self.console, transient=False,
        )
        self.task = self.progress.add_task("starting", total=1.0, title=title)
        self.progress.start()

    def update(self, event: Event) -> None:
        kw: dict[str, Any] = {"description": f"{event.step}: {event.message}"}
        if event.fraction is not None:
            kw["completed"] = event.fraction
        self.progress.update(self.task, **kw)

    def close(self, state: str, message: str = "") -> None:
        if state == "succeeded":
            self.progress.update(self.task, completed=1.0, description="done")
        else:
            self.progress.update(self.task, description=f"{state}: {message}")
        self.progress.stop()


def in_widget_kernel() -> bool:
    """Are we in a Jupyter kernel where widgets can render (like tqdm.auto decides)?"""
    try:
        from IPython import get_ipython

        ip = get_ipython()
        if ip is None or type(ip).__name__ != "ZMQInteractiveShell":
            return False
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    import os

    return os.environ.get(env.PROGRESS, "auto") != "text"


def make_view(title: str, mode: str | bool = "auto") -> ProgressView:
    if mode is False or mode == "none":
        return NullProgress()
    if mode == "widget" or (mode in ("auto", True) and in_widget_kernel()):
        try:
            return WidgetProgress(title)
        except Exception:
            pass
    return TextProgress(title)


def follow(backend: Any, op_id: str, view: ProgressView) -> Any:
    """Show an operation's events until it ends; return its result or raise its error.

    Ctrl-C (or "interrupt kernel") cancels the operation and raises ``OperationCancelled``.
    """
    try:
        for event in backend.events(op_id):
            view.update(event)
    except KeyboardInterrupt:
        backend.cancel(op_id)
        view.close("cancelled", "interrupted")
        raise OperationCancelled("interrupted: the operation was cancelled") from None
    try:
        result = backend.wait(op_id)
    except OperationCancelled as e:
        view.close("cancelled", e.message)
        raise
    except Exception as e:
        view.close("failed", getattr(e, "message", str(e)))
        raise
    view.close("succeeded")
    return result
