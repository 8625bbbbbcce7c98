"""An OpenAI-compatible HTTP server over the local backend (the ``serve`` extra).

It speaks the part of the OpenAI API that our clients (``ChatOpenAI``, the ``openai``
SDK) and vLLM's users rely on: ``GET /v1/models``, ``POST /v1/chat/completions`` (with
server-sent events when ``stream``), ``GET /health``, and vLLM's runtime adapter
endpoints ``POST /v1/load_lora_adapter`` / ``POST /v1/unload_lora_adapter`` with vLLM's
request bodies. The ``model`` of a request is the base model's name or an adapter's.

Safe by default: the CLI binds to 127.0.0.1; with an API key every ``/v1`` request needs
``Authorization: Bearer <key>`` (401 otherwise); adapter loading is off unless enabled,
and then takes only paths inside the adapters folder (after resolving symlinks); request
bodies, ``n`` and ``max_tokens`` are capped; every error is an OpenAI-style JSON error,
never a stack trace. Generation holds the backend's lock, so concurrent requests for
different adapters are served one batch at a time and never race on the active adapter;
a stream holds it for one token at a time, so batches run between its tokens.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from mascot.policies.local.backend import LocalBackend
from mascot.policies.local.chat_encoding import PromptError, check_template_kwargs
from mascot.policies.local.grammar import JSON_OBJECT, GrammarError
from mascot.policies.local.streaming import TextStream
from mascot.policies.model_source import LocalModelError
from mascot.policies.thinking import chat_template_kwargs

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerLimits:
    """What one request may ask for.

    Attributes:
        max_tokens: Largest ``max_tokens`` / ``max_completion_tokens``; larger values are
            lowered to it (and the default when a request names none).
        max_n: Largest ``n``.
        max_body_bytes: Largest request body.
    """

    max_tokens: int = 1024
    max_n: int = 8
    max_body_bytes: int = 1 << 20


class ChatMessage(BaseModel):
    """One message of a request; ``content`` may be text or OpenAI text parts."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.get("text", "") for part in self.content if part.get("type") == "text")
        return self.content or ""


class ChatRequest(BaseModel):
    """A ``/v1/chat/completions`` body; fields the local engine does not use are accepted."""

    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    # unset sampling values come from the model's generation config, as in vLLM
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)  # vLLM's extra field; -1 or 0 = off
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=10.0)  # vLLM's extra field
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    n: int = Field(default=1, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's extra field, over the server's default


class LoadAdapter(BaseModel):
    """vLLM's ``/v1/load_lora_adapter`` body."""

    lora_name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.-]+$")
    lora_path: str = Field(min_length=1)
    load_inplace: bool = False  # replace an adapter of the same name (its new version)


class UnloadAdapter(BaseModel):
    """vLLM's ``/v1/unload_lora_adapter`` body."""

    lora_name: str = Field(min_length=1)


def create_app(
    backend: LocalBackend,
    *,
    served_name: str | None = None,
    api_key: str | None = None,
    adapters_dir: str | Path | None = None,
    allow_runtime_lora: bool = False,
    limits: ServerLimits = ServerLimits(),
) -> FastAPI:
    """The FastAPI app serving ``backend``; run it with uvicorn.

    Args:
        backend: The loaded base model and adapters (adapter names are model names).
        served_name: The base model's name in requests and ``/v1/models``; default the
            backend's model reference.
        api_key: When set, every ``/v1`` request must send it as a bearer token.
        adapters_dir: The only folder runtime-loaded adapters may come from.
        allow_runtime_lora: Enable the load/unload endpoints (vLLM's
            ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``); they need ``adapters_dir``.
        limits: Request caps.

    Raises:
        ValueError: if runtime loading is enabled without an adapters folder.
    """
    if allow_runtime_lora and adapters_dir is None:
        raise ValueError("runtime adapter loading needs an adapters folder to confine the paths to")
    base_name = served_name or backend.name
    root = Path(adapters_dir).resolve() if adapters_dir is not None else None
    app = FastAPI(title="mascot local server", docs_url=None, redoc_url=None, openapi_url=None)
    started = int(time.time())

    @app.middleware("http")
    async def guard(request: Request, call_next: Any) -> Any:
        if api_key and request.url.path.startswith("/v1"):
            given = request.headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
                return _error(401, "invalid or missing API key", "AuthenticationError")
        length = request.headers.get("content-length")
        if length is None:  # chunked: read (Starlette keeps it for the endpoint) and measure
            too_big = request.method == "POST" and len(await request.body()) > limits.max_body_bytes
        else:
            too_big = not length.isdigit() or int(length) > limits.max_body_bytes
        if too_big:
            return _error(413, f"request body over {limits.max_body_bytes} bytes", "BadRequestError")
        return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        where = ".".join(str(p) for p in first["loc"] if p != "body")
        return _error(400, f"{where}: {first['msg']}" if where else first["msg"], "BadRequestError")

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return _error(exc.status_code, str(exc.detail),
                      "NotFoundError" if exc.status_code == 404 else "BadRequestError")

    @app.exception_handler(Exception)
    async def crash(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("request to %s failed", request.url.path)
        return _error(500, "internal server error", "InternalServerError")

    @app.get("/health")
    async def health() -> PlainTextResponse:
        return PlainTextResponse("")

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        names = [base_name, *backend.adapters]
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": started, "owned_by": "mascot",
             "root": backend.name, "parent": None if name == base_name else base_name} for name in names]}

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(body: ChatRequest) -> JSONResponse | StreamingResponse:
        if body.model != base_name and body.model not in backend.adapters:
            return _error(404, f"The model `{body.model}` does not exist.", "NotFoundError", param="model")
        if body.n > limits.max_n:
            return _error(400, f"n={body.n} is over this server's limit of {limits.max_n}", "BadRequestError",
                          param="n")
        adapter = None if body.model == base_name else body.model
        try:
            schema = _response_schema(body.response_format)
            variables = {**chat_template_kwargs(), **check_template_kwargs(body.chat_template_kwargs or {})}
        except (GrammarError, PromptError) as exc:
            return _error(400, str(exc), "BadRequestError",
                          param="chat_template_kwargs" if isinstance(exc, PromptError) else "response_format")
        loop = asyncio.get_running_loop()
        if schema is not None:  # compiled in a worker thread: a new schema takes seconds
            try:
                await loop.run_in_executor(backend.callers, backend.grammars.compile, schema)
            except (GrammarError, ImportError) as exc:
                return _error(400, str(exc), "BadRequestError", param="response_format")
        sampling = {"max_new_tokens": min(body.max_completion_tokens or body.max_tokens or limits.max_tokens,
                                          limits.max_tokens),
                    "temperature": body.temperature, "top_p": body.top_p, "seed": body.seed,
                    "top_k": 0 if body.top_k == -1 else body.top_k, "repetition_penalty": body.repetition_penalty,
                    "chat_template_kwargs": variables, "json_schema": schema}
        conversation = _conversation(body)
        stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        reply_id = f"chatcmpl-{uuid.uuid4().hex}"
        try:
            if body.stream:
                if body.n > 1:
                    return _error(400, "stream with n > 1 is not supported by the local engine", "BadRequestError",
                                  param="n")
                usage = bool((body.stream_options or {}).get("include_usage"))
                stream = await loop.run_in_executor(backend.callers, partial(
                    backend.stream, conversation, adapter=adapter, **sampling))
                return StreamingResponse(_events(stream, stop, reply_id, body.model, usage,
                                                 limit=sampling["max_new_tokens"]),
                                         media_type="text/event-stream")
            # in the backend's caller threads: concurrent requests meet in its batches
            generations = await loop.run_in_executor(backend.callers, partial(
                backend.generate, [conversation] * body.n, adapters=[adapter] * body.n, stop=stop, **sampling))
        except PromptError as exc:  # the chat template rejected the messages or a variable
            return _error(400, str(exc), "BadRequestError", param="messages")
        choices = [{"index": i, "message": {"role": "assistant", "content": g.text},
                    "finish_reason": "length" if g.completion_tokens >= sampling["max_new_tokens"] else "stop"}
                   for i, g in enumerate(generations)]
        completion = sum(g.completion_tokens for g in generations)
        prompt = generations[0].prompt_tokens
        return JSONResponse({"id": reply_id, "object": "chat.completion", "created": int(time.time()),
                             "model": body.model, "choices": choices,
                             "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                                       "total_tokens": prompt + completion}})

    @app.post("/v1/load_lora_adapter", response_model=None)
    async def load_adapter(body: LoadAdapter) -> PlainTextResponse | JSONResponse:
        if not allow_runtime_lora or root is None:
            return _error(404, "runtime adapter loading is disabled on this server", "NotFoundError")
        if body.lora_name == base_name:
            return _error(400, f"'{body.lora_name}' is the base model's name", "BadRequestError", param="lora_name")
        if body.lora_name in backend.adapters and not body.load_inplace:
            return _already_loaded(body.lora_name)
        path = _confined(body.lora_path, root)
        if path is None:
            return _error(400, "lora_path must be a folder inside the adapters folder", "BadRequestError",
                          param="lora_path")
        try:
            if body.lora_name in backend.adapters:  # load_inplace: the new version replaces the old one
                await asyncio.to_thread(backend.unload_adapter, body.lora_name)
            await asyncio.to_thread(backend.load_adapter, body.lora_name, path, version=_version(path))
        except LocalModelError as exc:
            return _error(400, _hide_folder(str(exc), root), "BadRequestError", param="lora_path")
        except ValueError:  # a concurrent request loaded the name first
            return _already_loaded(body.lora_name)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    @app.post("/v1/unload_lora_adapter", response_model=None)
    async def unload_adapter(body: UnloadAdapter) -> PlainTextResponse | JSONResponse:
        if not allow_runtime_lora:
            return _error(404, "runtime adapter loading is disabled on this server", "NotFoundError")
        if body.lora_name not in backend.adapters:
            return _error(404, f"The lora adapter '{body.lora_name}' cannot be found.", "NotFoundError",
                          param="lora_name")
        await asyncio.to_thread(backend.unload_adapter, body.lora_name)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")

    return app


def _conversation(body: ChatRequest) -> list[dict[str, str]]:
    return [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in body.messages]


def _response_schema(response_format: dict[str, Any] | None) -> dict[str, Any] | None:
    """The JSON schema decoding must follow for an OpenAI ``response_format``, if any.

    Raises:
        GrammarError: on an unknown type or a ``json_schema`` without a schema object.
    """
    kind = (response_format or {}).get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return JSON_OBJECT
    if kind == "json_schema":
        schema = (response_format or {}).get("json_schema", {})
        schema = schema.get("schema") if isinstance(schema, dict) else None
        if not isinstance(schema, dict):
            raise GrammarError("response_format.json_schema.schema must be a JSON schema object")
        return schema
    raise GrammarError(f"unknown response_format type {kind!r}; valid: text, json_object, json_schema")


async def _events(stream: TextStream, stop: list[str], reply_id: str, model: str, usage: bool, *,
                  limit: int) -> AsyncIterator[str]:
    """Server-sent events of a streamed reply, cut at the first stop string; the usage
    chunk has the stream's own token counts, as the whole reply's usage does."""
    created = int(time.time())

    def event(payload: dict[str, Any]) -> str:
        return "data: " + json.dumps({"id": reply_id, "object": "chat.completion.chunk", "created": created,
                                      "model": model, **payload}) + "\n\n"

    def chunk(delta: dict[str, Any], finish: str | None) -> str:
        return event({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

    yield chunk({"role": "assistant", "content": ""}, None)
    text, sent = "", 0
    done = object()
    # each piece is decoded in a worker thread: a token's forward pass must not block the event loop
    while (piece := await asyncio.to_thread(next, stream, done)) is not done:
        text += piece
        cut = min((text.find(s) for s in stop if s and s in text), default=-1)
        if cut >= 0:
            if cut > sent:
                yield chunk({"content": text[sent:cut]}, None)
            break
        if len(text) > sent:
            yield chunk({"content": text[sent:]}, None)
            sent = len(text)
    # past a stop string the reply is decoded to its end, unsent, as a whole reply is (its
    # batch runs every row to the end), so both report the same usage and finish reason
    await asyncio.to_thread("".join, stream)
    yield chunk({}, "length" if stream.completion_tokens >= limit else "stop")
    if usage:
        yield event({"choices": [], "usage": {"prompt_tokens": stream.prompt_tokens,
                                              "completion_tokens": stream.completion_tokens,
                                              "total_tokens": stream.prompt_tokens + stream.completion_tokens}})
    yield "data: [DONE]\n\n"


def _confined(given: str, root: Path) -> Path | None:
    """``given`` (relative to ``root``, or absolute) if it resolves to a folder inside ``root``."""
    if "\x00" in given:
        return None
    path = (root / given).resolve()
    return path if path.is_relative_to(root) and path != root and path.is_dir() else None


def _already_loaded(name: str) -> JSONResponse:
    """vLLM's refusal of a name already loaded (replacing it would switch the weights
    under requests already using it)."""
    return _error(400, f"The lora adapter '{name}' has already been loaded; unload it first "
                       "(POST /v1/unload_lora_adapter) or send load_inplace: true to load a new version "
                       "under this name.",
                  "BadRequestError", param="lora_name")


def _hide_folder(message: str, root: Path) -> str:
    """``message`` with paths made relative to the adapters folder ``root``: a client
    names adapters relative to it and need not learn where the server keeps its files."""
    return message.replace(f"{root}{os.sep}", "").replace(str(root), "the adapters folder")


def _version(path: Path) -> str | None:
    """The adapter card's creation time, as the version of a runtime-loaded adapter."""
    card = path / "adapter_card.json"
    if not card.is_file():
        return None
    try:
        return json.loads(card.read_text(encoding="utf-8")).get("created_at")
    except (OSError, ValueError) as exc:
        logger.warning("unreadable adapter card %s: %s", card, exc)
        return None


def _error(status: int, message: str, kind: str, *, param: str | None = None) -> JSONResponse:
    return JSONResponse(status_code=status,
                        content={"error": {"message": message, "type": kind, "param": param, "code": status}})
