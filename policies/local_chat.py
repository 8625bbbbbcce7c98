"""LangChain chat models on the local backend: one per role, each with its own adapter."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables.config import run_in_executor
from pydantic import ConfigDict, Field

from mascot.policies.local import LocalBackend, cut_at_stop

_ROLES = {"system": "system", "human": "user", "ai": "assistant"}


class LocalChatModel(BaseChatModel):
    """A LangChain chat model answering from a ``LocalBackend`` with one adapter.

    Several instances share one backend, so each persona can have its own adapter on
    one base model in memory.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    backend: LocalBackend
    adapter: str | None = None
    max_new_tokens: int = Field(default=256, ge=1)
    temperature: float = Field(default=0.7, ge=0.0)
    top_p: float = Field(default=0.95, gt=0.0, le=1.0)
    seed: int | None = None
    # Qwen3-style templates think aloud unless told not to; other templates ignore it.
    chat_template_kwargs: dict[str, Any] = Field(default_factory=lambda: {"enable_thinking": False})

    @property
    def _llm_type(self) -> str:
        return "mascot-local"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model_name": self.backend.name, "adapter": self.adapter}

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        result = self.backend.generate(
            [to_chat(messages)],
            adapters=[self.adapter],
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self._seed(run_manager),
            stop=stop,
            chat_template_kwargs=self.chat_template_kwargs,
        )[0]
        message = AIMessage(
            content=result.text,
            response_metadata=self._metadata(),
            usage_metadata={
                "input_tokens": result.prompt_tokens,
                "output_tokens": result.completion_tokens,
                "total_tokens": result.prompt_tokens + result.completion_tokens,
            },
        )
        return ChatResult(generations=[ChatGeneration(message=message)])

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        """``_generate`` in one of the backend's caller threads, so that as many concurrent
        async calls as a batch holds can wait in its queue together."""
        return await run_in_executor(self.backend.callers, self._generate, messages, stop,
                                     run_manager.get_sync() if run_manager else None, **kwargs)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        text = ""
        pieces = self.backend.stream(
            to_chat(messages),
            adapter=self.adapter,
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self._seed(run_manager),
            chat_template_kwargs=self.chat_template_kwargs,
        )
        for piece in pieces:
            if stop and cut_at_stop(text + piece, stop) != text + piece:
                piece = cut_at_stop(text + piece, stop)[len(text) :]
                if piece:
                    yield self._chunk(piece, run_manager)
                break
            text += piece
            if piece:
                yield self._chunk(piece, run_manager)
        yield ChatGenerationChunk(
            message=AIMessageChunk(content="", response_metadata=self._metadata(), chunk_position="last")
        )

    def _chunk(
        self, piece: str, run_manager: CallbackManagerForLLMRun | None
    ) -> ChatGenerationChunk:
        chunk = ChatGenerationChunk(message=AIMessageChunk(content=piece))
        if run_manager:
            run_manager.on_llm_new_token(piece, chunk=chunk)
        return chunk

    def _seed(self, run_manager: CallbackManagerForLLMRun | None) -> int | None:
        """The sampling seed of one call: ``seed``, varied by the run's ``episode_id`` and
        ``sample`` metadata, so repeated episodes and candidate samples differ while each
        stays reproducible whatever order concurrent calls run in."""
        if self.seed is None:
            return None
        metadata = run_manager.metadata if run_manager else {}
        if "episode_id" not in metadata and "sample" not in metadata:
            return self.seed
        key = f"{self.seed}|{metadata.get('episode_id')}|{metadata.get('sample')}"
        return int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big")

    def _metadata(self) -> dict[str, Any]:
        return {
            "model_name": self.backend.name,
            "adapter": self.adapter,
            "adapter_version": self.backend.adapter_versions.get(self.adapter) if self.adapter else None,
        }


def to_chat(messages: Sequence[BaseMessage]) -> list[dict[str, str]]:
    """LangChain messages as chat-template dicts (``role``/``content``).

    Raises:
        ValueError: on a message type a chat template cannot take (e.g. tool calls).
    """
    chat = []
    for message in messages:
        role = _ROLES.get(message.type)
        if role is None:
            raise ValueError(f"the local backend cannot send a '{message.type}' message")
        chat.append({"role": role, "content": message.text})
    return chat
