"""Kept for compatibility: the OpenAPI document's helpers live in
``jupyter_cloudtik.api.openapi`` (the document itself stays ``server/openapi.yaml``)."""

from ..api.openapi import spec, spec_json, spec_text, validate_body  # noqa: F401
