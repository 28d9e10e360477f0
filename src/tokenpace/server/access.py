"""Checks every API route shares: the bearer key and the model name."""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable

from fastapi import Request

from tokenpace.server.errors import ApiError


def authorizer(api_key: str | None) -> Callable[[Request], Awaitable[None]]:
    """A FastAPI dependency raising ApiError(401) unless the request carries
    ``Authorization: Bearer <api_key>`` (no check when ``api_key`` is None)."""

    async def authorize(request: Request) -> None:
        if api_key is None:
            return
        header = request.headers.get("authorization", "")
        expected = f"Bearer {api_key}"
        if not secrets.compare_digest(header.encode(), expected.encode()):
            raise ApiError(401, "missing or invalid API key", code="invalid_api_key")

    return authorize


def check_model(name: str | None, served: str) -> None:
    """Raise ApiError(404) naming ``model`` unless ``name`` is the served model (None:
    not given, for routes where it is optional)."""
    if name is not None and name != served:
        raise ApiError(
            404,
            f"the model {name!r} does not exist; this server serves {served!r}",
            param="model",
            code="model_not_found",
        )
