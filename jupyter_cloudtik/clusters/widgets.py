"""An ipywidgets view of one cluster: live table, scale, shut down, dashboard link."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

import ipywidgets as w

from ..core.errors import CloudTikError

if TYPE_CHECKING:
    from .api import Cluster


class ClusterWidget(w.VBox):
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.table = w.HTML()
        self.message = w.HTML()
        self.workers = w.BoundedIntText(value=0, min=0, max=10000, description="workers",
                                        layout=w.Layout(width="160px"))
        self.scale_button = w.Button(description="Scale", icon="arrows-v")
        self.refresh_button = w.Button(description="Refresh", icon="refresh")
        self.down_button = w.Button(description="Shut down", button_style="danger",
                                    icon="power-off")
        self._confirming = False
        self.scale_button.on_click(lambda _b: self._scale())
        self.refresh_button.on_click(lambda _b: self.refresh())
        self.down_button.on_click(lambda _b: self._down())
        super().__init__([
            self.table,
            w.HBox([self.workers, self.scale_button, self.refresh_button, self.down_button]),
            self.message,
        ])
        self.refresh()

    def refresh(self) -> None:
        try:
            info = self.cluster.refresh()
        except CloudTikError as e:
            self._say(e.message, error=True)
            return
        self.table.value = self.cluster._repr_html_()
        self.workers.value = info.wanted_workers
        stopped = info.state in ("stopped", "stopping")
        self.scale_button.disabled = stopped
        self.down_button.disabled = stopped

    def _scale(self) -> None:
        self._say(f"scaling to {self.workers.value} workers…")
        try:
            self.cluster.scale(int(self.workers.value), progress=False)
        except CloudTikError as e:
            self._say(e.message, error=True)
            return
        self._say(f"scaled to {self.workers.value} workers")
        self.refresh()

    def _down(self) -> None:
        if not self._confirming:
            self._confirming = True
            self.down_button.description = "Confirm shut down"
            self._say("click again to shut the cluster down")
            return
        self._confirming = False
        self.down_button.description = "Shut down"
        self._say("shutting down…")
        try:
            self.cluster.down(progress=False)
        except CloudTikError as e:
            self._say(e.message, error=True)
            return
        self._say("stopped")
        self.refresh()

    def _say(self, text: str, error: bool = False) -> None:
        color = "#c62828" if error else "#555"
        self.message.value = f"<span style='color:{color}'>{html.escape(text)}</span>"
