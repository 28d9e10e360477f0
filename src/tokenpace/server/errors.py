"""OpenAI-style errors: ``{"error": {"message", "type", "param", "code"}}``.

Every error a client can cause becomes one of these with a one-sentence message; request
validation errors name the offending field in ``param``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
}


class ApiError(Exception):
    """An error answered as ``status`` with an OpenAI-style body."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = dict(headers or {})


def error_body(status: int, message: str, param: str | None, code: str | None) -> dict[str, Any]:
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(
        error_body(error.status, error.message, error.param, error.code),
        status_code=error.status,
        headers=error.headers,
    )


def describe_validation(errors: Sequence[Any]) -> tuple[str, str | None]:
    """(message, param) for the first pydantic/FastAPI validation error."""
    if not errors:
        return "invalid request body", None
    first = errors[0]
    kind = str(first.get("type", ""))
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    if kind == "json_invalid":
        return "the request body is not valid JSON", None
    # The top-level field: deeper parts mix field names with union-member tags ("str").
    param = loc[0] if loc and not loc[0].isdigit() else None
    if kind == "extra_forbidden":
        path = _dotted([part for part in loc if part not in _UNION_TAGS])
        return f"unknown field '{path}': this server does not honour it", path
    if kind == "missing" and param is None:
        return "the request body is missing", None
    message = str(first.get("msg", "invalid value"))
    where = f"'{param}'" if param else "the request body"
    if kind == "missing":
        return f"{where} is required", param
    return f"invalid value for {where}: {message}", param


# Names pydantic puts in an error's location for the member of a union it tried.
_UNION_TAGS = frozenset({"str", "list[str]", "list[int]", "list[TextPart]", "int", "float"})


def _dotted(parts: Sequence[str]) -> str:
    """``["messages", "0", "name"]`` -> ``"messages[0].name"``."""
    path = ""
    for part in parts:
        path += f"[{part}]" if part.isdigit() else (f".{part}" if path else part)
    return path


def install_error_handlers(app: FastAPI) -> None:
    """Answer validation errors, HTTP errors and ``ApiError`` in the OpenAI shape."""

    async def on_api_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return error_response(exc)

    async def on_validation(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        message, param = describe_validation(exc.errors())
        return error_response(ApiError(400, message, param=param, code="invalid_value"))

    async def on_http(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        headers = dict(exc.headers or {})
        return error_response(ApiError(exc.status_code, str(exc.detail), headers=headers))

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
