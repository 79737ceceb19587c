"""Errors in the shapes Huawei Cloud services answer with.

Each service family formats its error body its own way; the SDK's exception handler reads
all of them (``error_code``/``error_msg``, ``code``/``message``, or nested under ``error``),
so clients see a ``ClientRequestException``/``ServerResponseException`` with the code and
message a real service would give.
"""

from __future__ import annotations

from typing import Any

# service -> how its error body looks
_STYLES = {
    "ecs": "nested",      # {"error": {"code": "Ecs.0114", "message": "..."}}
    "iam": "nested",
    "vpc": "flat",        # {"code": "VPC.0101", "message": "..."}
    "eip": "flat",
    "nat": "error_code",  # {"error_code": "NAT.0001", "error_msg": "..."}
    "ims": "error_code",
    "kps": "error_code",
    "tms": "error_code",
    "apigw": "error_code",
}

# the API gateway's throttling answer: HTTP 429 "APIG.0308" (Huawei Cloud FAQ "How Do I
# Handle the Error APIG.0308?", support.huaweicloud.com/intl/en-us/oce_faq/
# en-us_topic_0000001887959462.html)
THROTTLED = ("APIG.0308", "The throttling threshold has been reached: policy user over "
             "ratelimit, limit:20, time:1 second")
BAD_SIGNATURE = "APIGW.0301"


class ApiError(Exception):
    """An error answer: HTTP status, the service's error code and message."""

    def __init__(self, status: int, code: str, message: str, service: str = "apigw") -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.service = service

    def body(self, request_id: str) -> dict[str, Any]:
        style = _STYLES.get(self.service, "error_code")
        if style == "nested":
            return {"error": {"code": self.code, "message": self.message},
                    "request_id": request_id}
        if style == "flat":
            return {"code": self.code, "message": self.message, "request_id": request_id}
        return {"error_code": self.code, "error_msg": self.message, "request_id": request_id}


def not_found(service: str, what: str, ident: str) -> ApiError:
    codes = {"ecs": "Ecs.0114", "vpc": "VPC.0202", "eip": "VPC.0504", "nat": "NAT.0001",
             "iam": "1101", "kps": "KPS.0002", "ims": "IMG.0004"}
    return ApiError(404, codes.get(service, "Common.0404"),
                    f"{what} [{ident}] could not be found.", service)


def quota_exceeded(service: str, resource: str, limit: int, used: int, asked: int) -> ApiError:
    """What a service says when a create would go over the tenant's quota."""
    # ECS: "Ecs.0001 Insufficient ECS quota", HTTP 400 (ECS API reference, Error Codes,
    # https://support.huaweicloud.com/intl/en-us/api-ecs/ecs_07_0002.html)
    codes = {"ecs": "Ecs.0001", "vpc": "VPC.0106", "eip": "VPC.0513", "nat": "NAT.0024",
             "iam": "1109", "kps": "KPS.0004"}
    return ApiError(
        400 if service != "iam" else 409,
        codes.get(service, "Common.0403"),
        ("Insufficient ECS quota. Contact customer service to increase quota. " if
         service == "ecs" else "") + f"Quota exceeded for resource '{resource}': limit "
        f"{limit}, used {used}, requested {asked}.",
        service,
    )


def bad_request(service: str, message: str, code: str | None = None) -> ApiError:
    codes = {"ecs": "Ecs.0005", "vpc": "VPC.0002", "eip": "VPC.0501", "nat": "NAT.0003",
             "iam": "1100", "kps": "KPS.0001", "ims": "IMG.0001"}
    return ApiError(400, code or codes.get(service, "Common.0400"), message, service)


def conflict(service: str, message: str, code: str | None = None) -> ApiError:
    codes = {"ecs": "Ecs.0031", "vpc": "VPC.0011", "eip": "VPC.0520", "nat": "NAT.0011",
             "iam": "1109", "kps": "KPS.0003"}
    return ApiError(409, code or codes.get(service, "Common.0409"), message, service)
