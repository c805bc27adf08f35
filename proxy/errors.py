"""Errors the proxy itself produces, always in the OpenAI shape with the right status."""

from __future__ import annotations

import orjson
from aiohttp import web

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    431: "invalid_request_error",
    500: "internal_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "upstream_timeout",
}


def error_body(status: int, message: str, code: str, param: str | None = None) -> bytes:
    err = {"message": message, "type": _TYPES.get(status, "error"), "param": param, "code": code}
    return orjson.dumps({"error": err})


def error_response(
    status: int,
    message: str,
    code: str,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    return web.Response(
        status=status,
        body=error_body(status, message, code, param),
        content_type="application/json",
        headers=headers,
    )


class ProxyError(Exception):
    """Raised on the request path; the handler turns it into an OpenAI-shaped response."""

    def __init__(self, status: int, message: str, code: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param

    def response(self, headers: dict[str, str] | None = None) -> web.Response:
        return error_response(self.status, self.message, self.code, self.param, headers)
