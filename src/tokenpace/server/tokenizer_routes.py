"""vLLM's tokenizer endpoints, which benchmark tools use to align prompt lengths:
``POST /tokenize``, ``POST /detokenize`` and ``GET /version``.

``/tokenize`` takes a completions ``prompt`` (``add_special_tokens`` defaults to true) or
chat ``messages`` (rendered by the chat template; ``add_generation_prompt`` defaults to
true, ``add_special_tokens`` to false, as vLLM's) and answers ``{"count",
"max_model_len", "tokens", "token_strs"}``;
``/detokenize`` takes ``tokens`` and answers ``{"prompt"}``. ``model`` is optional; when
given it must be the served model. ``GET /tokenizer_info`` (opt-in, as in vLLM) answers
the tokenizer's configuration (its constructor arguments, file paths left out, special
tokens as their text), ``tokenizer_class`` and ``chat_template``, which evaluation harnesses
read to tokenize through the server. The API key, when set, guards them as it guards /v1.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

from tokenpace import __version__
from tokenpace.server.access import authorizer, check_model
from tokenpace.server.errors import ApiError
from tokenpace.server.prompts import chat_prompt_ids, completion_prompt_ids, longest_prompt_chars
from tokenpace.server.schemas import ChatMessage
from tokenpace.server.service import Service

_STRICT = ConfigDict(strict=True, extra="forbid")


class TokenizeRequest(BaseModel):
    """Exactly one of ``prompt`` and ``messages``."""

    model_config = _STRICT

    model: StrictStr | None = None
    prompt: StrictStr | list[StrictStr] | list[int] | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None
    add_special_tokens: StrictBool | None = None
    add_generation_prompt: StrictBool = True
    return_token_strs: StrictBool = False


class DetokenizeRequest(BaseModel):
    model_config = _STRICT

    model: StrictStr | None = None
    tokens: list[int]


def tokenizer_info(tokenizer: Any) -> dict[str, Any]:
    """What ``GET /tokenizer_info`` answers for ``tokenizer`` (a transformers tokenizer)."""
    config = {
        key: _json_ready(value)
        for key, value in (getattr(tokenizer, "init_kwargs", None) or {}).items()
        if key not in _FILE_FIELDS
    }
    config["tokenizer_class"] = type(tokenizer).__name__
    template = getattr(tokenizer, "chat_template", None)
    if template:
        config["chat_template"] = template
    return config


# Constructor arguments that name files on the server's disk.
_FILE_FIELDS = frozenset({"vocab_file", "merges_file", "tokenizer_file", "name_or_path"})


def _json_ready(value: Any) -> Any:
    """``value`` with special tokens as their text and containers converted throughout;
    anything else JSON cannot carry as its ``str``."""
    if hasattr(value, "content") and isinstance(value.content, str):
        return value.content
    if isinstance(value, dict):
        return {str(k): _json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_ready(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def build_tokenizer_router(
    service: Service, model_name: str, api_key: str | None, with_info: bool = False
) -> APIRouter:
    """The tokenizer routes bound to ``service``'s tokenizer; ``with_info`` adds
    ``GET /tokenizer_info``."""
    router = APIRouter()
    guarded = [Depends(authorizer(api_key))]

    @router.post("/tokenize", dependencies=guarded)
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        check_model(body.model, model_name)
        tokenizer = service.tokenizer
        if (body.prompt is None) == (body.messages is None):
            raise ApiError(400, "give exactly one of 'prompt' and 'messages'", param="prompt")
        if body.messages is not None:
            service.check_prompt_chars(sum(len(m.text()) for m in body.messages), "messages")
            special = bool(body.add_special_tokens)
            ids = chat_prompt_ids(tokenizer, body.messages, body.add_generation_prompt, special)
        else:
            assert body.prompt is not None
            service.check_prompt_chars(longest_prompt_chars(body.prompt), "prompt")
            special = True if body.add_special_tokens is None else body.add_special_tokens
            ids = completion_prompt_ids(tokenizer, body.prompt, special)
        strs = tokenizer.convert_ids_to_tokens(ids) if body.return_token_strs else None
        return {
            "count": len(ids),
            "max_model_len": service.limits.max_model_len,
            "tokens": ids,
            "token_strs": strs,
        }

    @router.post("/detokenize", dependencies=guarded)
    async def detokenize(body: DetokenizeRequest) -> dict[str, Any]:
        check_model(body.model, model_name)
        vocab = len(service.tokenizer)
        if any(not 0 <= t < vocab for t in body.tokens):
            raise ApiError(400, f"'tokens' must be in [0, {vocab})", param="tokens")
        return {"prompt": service.tokenizer.decode(body.tokens)}

    if with_info:

        @router.get("/tokenizer_info", dependencies=guarded)
        async def get_tokenizer_info() -> dict[str, Any]:
            return tokenizer_info(service.tokenizer)

    @router.get("/version")
    async def version() -> dict[str, str]:
        return {"version": __version__}

    return router
