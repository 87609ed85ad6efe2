"""API errors, one exception in both shapes: OpenAI's {"error": {"message", "type", "param", "code"}} and
Anthropic's {"type": "error", "error": {"type", "message"}} (the Messages API, messages_api.py)."""

from __future__ import annotations

import json

from starlette.responses import JSONResponse


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type_: str = "invalid_request_error", headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type_
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)

    def sse(self) -> str:
        """The error as a server-sent event; a stream that fails ends with it and then [DONE]."""
        return "data: " + json.dumps(self.body()) + "\n\ndata: [DONE]\n\n"

    # -- Anthropic's shape ----------------------------------------------------------------------------
    def anthropic_body(self) -> dict:
        kind = ANTHROPIC_TYPES.get(self.status, "api_error" if self.status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": self.message}}

    def anthropic_response(self) -> JSONResponse:
        return JSONResponse(self.anthropic_body(), status_code=self.status, headers=self.headers)

    def anthropic_sse(self) -> str:
        """The error as the `error` event that ends a Messages stream."""
        return "event: error\ndata: " + json.dumps(self.anthropic_body()) + "\n\n"


ENGINE_ERROR = "the engine failed on this request; the server log has the details"


def engine_error(message: str = ENGINE_ERROR) -> APIError:
    """A 500 for a failed forward or a handler's bug: the client learns nothing more than the log's place."""
    return APIError(500, message, None, "engine_error", "server_error")


# Anthropic's error type per HTTP status (its API reference, "Errors"); a busy queue is "overloaded".
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
                   503: "overloaded_error", 529: "overloaded_error"}


def http_error(request, exc) -> JSONResponse:
    """Starlette's own errors (unknown route 404, wrong method 405, ...) in the OpenAI error shape."""
    kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    message = {404: f"no route {request.method} {request.url.path}",
               405: f"{request.url.path} does not take {request.method}"}.get(exc.status_code, str(exc.detail))
    headers = getattr(exc, "headers", None)
    return APIError(exc.status_code, message, None, kind, "invalid_request_error", headers).response()


def server_busy(waiting: int, retry_after_s: int) -> APIError:
    """503 with Retry-After: `waiting` requests already wait for the engine or are being prepared for it."""
    return APIError(503, f"the server is busy: {waiting} requests are already waiting; retry after {retry_after_s} s",
                    None, "server_busy", "server_error", headers={"Retry-After": str(retry_after_s)})
