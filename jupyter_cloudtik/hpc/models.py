"""The job as faces see it (the Python API, magics, CLI and REST share this shape)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from .base import FINAL_STATES, SUBMITTING


@dataclass
class JobInfo:
    id: str
    name: str
    backend: str
    backend_type: str
    kind: str  # notebook | command
    state: str  # submitting | queued | running | succeeded | failed | cancelled | unknown
    native_id: str | None = None
    native_state: str | None = None
    reason: str | None = None
    exit_code: int | None = None
    error: dict[str, Any] | None = None  # the failing notebook cell
    notebook: str | None = None
    command: list[str] | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    resources: dict[str, Any] = field(default_factory=dict)
    attributes: dict[str, Any] = field(default_factory=dict)
    inputs: list[dict[str, Any]] = field(default_factory=list)
    output: str | None = None
    output_notebook: str | None = None
    warnings: list[str] = field(default_factory=list)  # e.g. parameters the notebook ignores
    sweep: str | None = None  # the sweep this job is an element of (hpc.sweeps)
    # how the job got its environment (hpc/environment.py ``summary``): mode, hash, ...
    environment: dict[str, Any] = field(default_factory=dict)
    op_id: str | None = None
    user: str | None = None
    created_at: float = 0.0
    updated_at: float = 0.0
    submitted_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None

    @property
    def done(self) -> bool:
        return self.state in FINAL_STATES

    @property
    def state_label(self) -> str:
        if self.native_state and self.state != SUBMITTING:
            return f"{self.state} ({self.native_state})"
        return self.state

    @property
    def runtime_seconds(self) -> float | None:
        if not self.started_at:
            return None
        return (self.finished_at or time.time()) - self.started_at

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> JobInfo:
        return cls(**{k: d.get(k) for k in cls.__dataclass_fields__ if k in d})
