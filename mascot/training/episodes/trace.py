"""A local JSONL trace of every model call, for users without LangSmith.

LangSmith needs nothing from us: LangChain traces every run when ``LANGSMITH_TRACING``
and ``LANGSMITH_API_KEY`` are set. ``JsonlTracer`` is the offline alternative: a
LangChain callback handler that writes one line per model call.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, LLMResult

from mascot.training.jsonl import JsonlAppender

_ROLES = {"system": "system", "human": "user", "ai": "assistant", "tool": "tool"}


class JsonlTracer(BaseCallbackHandler):
    """Writes each chat-model call as a JSONL record.

    A record holds: time, episode id (from the run's metadata), role (the graph node),
    model, adapter, the prompt messages, the reply, latency, token counts, and the error
    of a failed call. Every line passes through ``redact`` before it is written.
    """

    run_inline = True  # write from the calling thread, in order
    raise_error = True  # a trace that cannot be written must not pass unnoticed

    def __init__(
        self, path: str | Path, *, redact: Callable[[str], str] | None = None, repair: bool = True
    ) -> None:
        """Append to ``path`` (created if missing; ``repair`` as for ``JsonlAppender``).

        Raises:
            JsonlError: if the file cannot be written.
        """
        self._out = JsonlAppender(path, redact=redact, fsync=False, repair=repair)
        self._calls: dict[UUID, dict[str, Any]] = {}
        self._lock = threading.Lock()

    @property
    def path(self) -> Path:
        """The trace file."""
        return self._out.path

    def on_chat_model_start(
        self,
        serialized: dict[str, Any],
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Remember the prompt and the start time of a call."""
        metadata = metadata or {}
        call = {
            "start": time.perf_counter(),
            "episode_id": metadata.get("episode_id"),
            "role": metadata.get("langgraph_node"),
            "model": metadata.get("ls_model_name"),
            "prompt": [_message(m) for m in messages[0]] if messages else [],
        }
        with self._lock:
            self._calls[run_id] = call

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        """Write the record of a finished call."""
        call = self._pop(run_id)
        if call is None:
            return
        generation = response.generations[0][0] if response.generations and response.generations[0] else None
        reply, meta, usage = "", {}, None
        if isinstance(generation, ChatGeneration):
            reply = generation.message.text
            meta = generation.message.response_metadata or {}
            if isinstance(generation.message, AIMessage):
                usage = generation.message.usage_metadata
        self._write(
            call,
            reply=reply,
            model=meta.get("model_name") or call["model"],
            adapter=meta.get("adapter"),
            adapter_version=meta.get("adapter_version"),
            usage={"input_tokens": usage["input_tokens"], "output_tokens": usage["output_tokens"]}
            if usage
            else None,
        )

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """Write the record of a failed call."""
        call = self._pop(run_id)
        if call is not None:
            self._write(call, error=f"{type(error).__name__}: {error}")

    def close(self) -> None:
        """Close the trace file."""
        self._out.close()

    def _pop(self, run_id: UUID) -> dict[str, Any] | None:
        with self._lock:
            return self._calls.pop(run_id, None)

    def _write(self, call: dict[str, Any], **fields: Any) -> None:
        latency = time.perf_counter() - call.pop("start")
        record = {
            "time": datetime.now(UTC).isoformat(timespec="milliseconds"),
            **call,
            **fields,
            "latency_s": round(latency, 4),
        }
        self._out.write({k: v for k, v in record.items() if v is not None})


def _message(message: BaseMessage) -> dict[str, Any]:
    row = {"role": _ROLES.get(message.type, message.type), "content": message.text}
    if message.name:
        row["name"] = message.name
    return row
