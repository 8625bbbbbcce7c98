"""Scripted chat models for graph tests: fixed replies in order, every prompt recorded."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable, Iterator
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from pydantic import Field


class ScriptedChat(BaseChatModel):
    """Answers with ``replies`` in order (and fails loudly when they run out)."""

    replies: list[str]
    calls: list[list[BaseMessage]] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _next(self, messages: list[BaseMessage]) -> str:
        self.calls.append(list(messages))
        if not self.replies:
            raise AssertionError("scripted model ran out of replies")
        return self.replies.pop(0)

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None,
                  **kw: Any) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=AIMessage(self._next(messages)))])

    def _stream(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None,
                **kw: Any) -> Iterator[ChatGenerationChunk]:
        for word in self._next(messages).split(" "):
            chunk = ChatGenerationChunk(message=AIMessageChunk(content=word + " "))
            if run_manager:
                run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            yield chunk


class PromptChat(BaseChatModel):
    """Replies as a function of the prompt, so concurrent runs stay deterministic.

    Async calls first sleep ``delay(prompt)`` seconds, to shuffle completion order.
    ``fail(prompt)`` may return an exception to raise instead of replying.
    """

    reply: Callable[[str], str]
    delay: Callable[[str], float] = lambda prompt: 0.0
    fail: Callable[[str], BaseException | None] = lambda prompt: None

    @property
    def _llm_type(self) -> str:
        return "prompt-function"

    def _answer(self, messages: list[BaseMessage]) -> ChatResult:
        prompt = "\n".join(m.text for m in messages)
        error = self.fail(prompt)
        if error is not None:
            raise error
        text = self.reply(prompt)
        usage = {"input_tokens": len(prompt.split()), "output_tokens": len(text.split()),
                 "total_tokens": len(prompt.split()) + len(text.split())}
        return ChatResult(generations=[ChatGeneration(message=AIMessage(
            text, response_metadata={"model_name": "prompt-fake"}, usage_metadata=usage))])

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None,
                  **kw: Any) -> ChatResult:
        return self._answer(messages)

    async def _agenerate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None,
                         **kw: Any) -> ChatResult:
        await asyncio.sleep(self.delay("\n".join(m.text for m in messages)))
        return self._answer(messages)


def digest(text: str) -> int:
    """A stable number for a text."""
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)


def director_fake(persona_ids: list[str], **kwargs: Any) -> PromptChat:
    """A Director that picks a persona (or hands back) from a hash of its prompt."""
    choices = [*persona_ids, "user"]
    return PromptChat(reply=lambda p: json.dumps(
        {"speaker": choices[digest(p) % len(choices)], "action": "respond", "tone": "warm"}), **kwargs)


def speaker_fake(**kwargs: Any) -> PromptChat:
    """Speakers and simulated users that answer with a hash of their prompt."""
    return PromptChat(reply=lambda p: f"reply {digest(p) % 10007}", **kwargs)
