"""Retrying Huawei Cloud calls: exponential backoff with jitter inside a bounded budget.

The SDK does not retry.  Throttling (HTTP 429, ``APIG.0308``) and server errors (5xx,
dropped connections, timeouts) are retried with "equal jitter" backoff (a throttling
answer whose window is long, "time:1 minute", is waited out: ``RetryPolicy.for_window``) — half the
exponential delay fixed, half random — so many clients that were throttled together do not
come back together.  Every call has a budget of attempts *and* of seconds spent waiting,
so a cloud that stays unhealthy yields a clear error instead of a hang.

A create that failed with a server error may still have happened (the answer was lost).
Callers pass ``recover``: before each retry of such a call it looks the resource up by
name or token, and returns it if it exists, so a retry never makes a second one.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from huaweicloudsdkcore.exceptions import exceptions as sdk_exc

from ...core.errors import NodeLaunchError, OperationCancelled, ProviderError

T = TypeVar("T")

# APIG.0308 is the gateway's documented throttling code (HTTP 429); the APIGW.* forms are
# kept for gateways that prefix their codes so
THROTTLE_CODES = {"APIG.0308", "APIGW.0308", "APIGW.0309", "APIGW.0310", "429"}
# insufficient quota: ECS "Ecs.0001" on HTTP 400 (ECS API reference, Error Codes,
# https://support.huaweicloud.com/intl/en-us/api-ecs/ecs_07_0002.html); VPC/EIP/NAT/KPS
# quota codes of their services' error-code pages
QUOTA_CODES = {"Ecs.0001", "VPC.0106", "VPC.0513", "NAT.0024", "KPS.0004"}
# what another offer (zone, flavor) may serve: quota, the flavor's capacity ("Ecs.0319",
# sold out), IP addresses of the subnet ("Ecs.0012"), an image the flavor cannot run
# ("Ecs.0007"); the message comes from the cloud as is
LAUNCH_CODES = QUOTA_CODES | {"Ecs.0319", "Ecs.0012", "Ecs.0007"}


#: the throttling answer names its window: "The throttling threshold has been reached:
#: policy user over ratelimit,limit:XX,time:1 minute" (Huawei Cloud FAQ "How Do I Handle
#: the Error APIG.0308?", https://support.huaweicloud.com/intl/en-us/ocr_faq/
#: ocr_01_0041.html; "time:1 second" in oce_faq/en-us_topic_0000001887959462.html)
WINDOW_RE = re.compile(r"time\s*:\s*(\d+(?:\.\d+)?)\s*(second|minute|hour)", re.I)
WINDOW_UNITS = {"second": 1.0, "minute": 60.0, "hour": 3600.0}
#: a window longer than this is waited out (more tries, longer waits); shorter ones are
#: what the ordinary schedule covers
LONG_WINDOW = 2.0
#: the window assumed when the answer's text is not seen: the SDK turns every 429 into
#: "too many 429 error responses" before reading the body (huaweicloudsdkcore
#: http_client.py: urllib3 Retry(total=retry_times=0, status_forcelist=[429]);
#: exception_handler.py process_retry_error), and per-minute limits are the documented
#: case
DEFAULT_THROTTLE_WINDOW = 60.0


def throttle_window(exc: BaseException) -> float | None:
    """Seconds of the rate-limit window a throttling answer names, or None."""
    m = WINDOW_RE.search(str(getattr(exc, "error_msg", "") or exc))
    return float(m.group(1)) * WINDOW_UNITS[m.group(2).lower()] if m else None


@dataclass
class RetryPolicy:
    attempts: int = 6          # tries in all (1 = no retry)
    base_delay: float = 0.5    # seconds before the first retry (doubles each time)
    max_delay: float = 8.0     # cap of one wait
    budget: float = 60.0       # most seconds spent waiting for one call
    #: tries in all when throttled over a long window (per-minute limits): the ordinary
    #: 6 tries wait 8-15 s, a quarter of a one-minute window
    throttle_attempts: int = 16

    def delay(self, retry: int, cap: float | None = None) -> float:
        exp = min(cap or self.max_delay, self.base_delay * (2 ** retry))
        return exp / 2 + random.uniform(0, exp / 2)

    def for_window(self, window: float | None) -> tuple[int, float, float]:
        """(tries, waiting budget, cap of one wait) for a throttling answer naming
        ``window``: a long window is waited out (1.5 windows at least), in waits of up to
        a quarter window, so the call is tried again soon after the window turns."""
        if window is None or window <= LONG_WINDOW:
            return self.attempts, self.budget, self.max_delay
        return (max(self.attempts, self.throttle_attempts), max(self.budget, 1.5 * window),
                max(self.max_delay, window / 4))


def classify(exc: BaseException) -> str | None:
    """'throttled', 'server' or 'connection' for retryable failures, else None."""
    if isinstance(exc, sdk_exc.ServiceResponseException):
        code = str(exc.error_code or "")
        if exc.status_code == 429 or code in THROTTLE_CODES:
            return "throttled"
        if exc.status_code >= 500:
            return "server"
        return None
    if isinstance(exc, (sdk_exc.ConnectionException, sdk_exc.RequestTimeoutException)):
        return "connection"
    return None


def describe(exc: BaseException) -> str:
    """A one-line, secret-free account of an SDK failure."""
    if isinstance(exc, sdk_exc.ServiceResponseException):
        msg = str(exc.error_msg or "").strip()
        if "too many 429 error responses" in msg:
            msg = "throttled (HTTP 429)"
        rid = f", request {exc.request_id}" if exc.request_id else ""
        return f"{exc.error_code}: {msg} (HTTP {exc.status_code}{rid})"
    if isinstance(exc, sdk_exc.SdkException):
        return f"{type(exc).__name__}: {exc.error_msg}"
    return f"{type(exc).__name__}: {exc}"


def error_code(exc: BaseException) -> str | None:
    if isinstance(exc, sdk_exc.ServiceResponseException):
        return str(exc.error_code) if exc.error_code is not None else None
    return None


def status_code(exc: BaseException) -> int | None:
    return getattr(exc, "status_code", None)


def call_with_retry(
    fn: Callable[[], T],
    *,
    what: str,
    policy: RetryPolicy,
    recover: Callable[[], T | None] | None = None,
    on_retry: Callable[[str, int, float, str], None] | None = None,
    checkpoint: Callable[[], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run ``fn`` until it succeeds, fails for good, or the budget is spent."""
    waited = 0.0
    attempt = 0
    while True:
        attempt += 1
        try:
            return fn()
        except Exception as exc:
            kind = classify(exc)
            if kind is None:
                raise
            tries, budget, cap = policy.for_window(
                (throttle_window(exc) or DEFAULT_THROTTLE_WINDOW) if kind == "throttled"
                else None)
            delay = policy.delay(attempt - 1, cap)
            if attempt >= tries or waited + delay > budget:
                raise ProviderError(
                    f"Huawei Cloud {what} failed after {attempt} attempt(s) over "
                    f"{waited:.1f}s of retrying: {describe(exc)}",
                    code=error_code(exc), status=status_code(exc), cloud=describe(exc),
                ) from None
            if on_retry is not None:
                on_retry(what, attempt, delay, describe(exc))
            if checkpoint is not None:
                checkpoint()
            sleep(delay)
            waited += delay
            if recover is not None and kind != "throttled":
                # the failed call may have been carried out: look before trying again
                found = recover()
                if found is not None:
                    return found


def as_provider_error(exc: BaseException, what: str) -> ProviderError:
    """The error a person reads for a non-retryable SDK failure of ``what``."""
    if isinstance(exc, (ProviderError, OperationCancelled)):
        return exc  # type: ignore[return-value]
    return ProviderError(f"Huawei Cloud {what} failed: {describe(exc)}",
                         code=error_code(exc), status=status_code(exc), cloud=describe(exc))


def as_launch_error(exc: BaseException, what: str) -> ProviderError:
    """Quota and capacity refusals become ``NodeLaunchError`` with the cloud's code."""
    code = getattr(exc, "details", {}).get("code") if isinstance(exc, ProviderError) else (
        error_code(exc))
    if isinstance(exc, NodeLaunchError):
        return exc
    if code in LAUNCH_CODES:
        msg = (exc.details.get("cloud") or exc.message) if isinstance(exc, ProviderError) \
            else describe(exc)
        return NodeLaunchError(f"Huawei Cloud refused to {what}: {msg}", code=code)
    return as_provider_error(exc, what)


def call_details(exc: BaseException) -> dict[str, Any]:
    return {"code": error_code(exc), "status": status_code(exc)}
