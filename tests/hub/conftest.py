"""Fixtures of the hub tests."""

from __future__ import annotations

import logging
import time

import pytest


class ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def sklog():
    logger = logging.getLogger(f"test.sidekicks.{time.monotonic_ns()}")
    logger.setLevel(logging.DEBUG)
    handler = ListHandler()
    logger.addHandler(handler)
    logger.lines = handler.lines  # type: ignore[attr-defined]
    return logger
