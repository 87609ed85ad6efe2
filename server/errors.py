"""OpenAI-style errors: {"error": {"message", "type", "param", "code"}} with a 4xx status."""

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


def http_error(request, exc) -> JSONResponse:
    """Starlette's own errors (unknown route 404, wrong method 405, ...) in the OpenAI error shape."""
    kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    message = {404: f"no route {request.method} {request.url.path}",
               405: f"{request.url.path} does not take {request.method}"}.get(exc.status_code, str(exc.detail))
    headers = getattr(exc, "headers", None)
    return APIError(exc.status_code, message, None, kind, "invalid_request_error", headers).response()
