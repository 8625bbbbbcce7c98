"""Message conversions, in one place: LangChain messages (what the graphs hold) <-> OpenAI
chat dicts (what chat templates and servers take) <-> episode history (OpenAI dicts with
persona names and stage directions, what episodes store).

Needs only ``langchain_core``: the graphs, the policies, the local backend and the training
stages all convert through here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage

#: LangChain message type -> OpenAI chat role.
ROLES = {"system": "system", "human": "user", "ai": "assistant"}


def openai_messages(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    """The conversation as episode history: OpenAI chat format with persona names and
    stage directions.

    Persona turns become ``{"role": "assistant", "name": <persona id>, "content": ...,
    "stage_direction": {...}}``; the person's turns ``{"role": "user", ...}``; other
    message types (tool calls) are left out.
    """
    rows: list[dict[str, Any]] = []
    for message in messages:
        if isinstance(message, AIMessage):
            row: dict[str, Any] = {"role": "assistant", "content": message.text}
            if message.name:
                row["name"] = message.name
            if "stage_direction" in message.additional_kwargs:
                row["stage_direction"] = message.additional_kwargs["stage_direction"]
            rows.append(row)
        elif message.type == "human":
            rows.append({"role": "user", "content": message.text})
        elif message.type == "system":
            rows.append({"role": "system", "content": message.text})
    return rows


def chat_messages(messages: Sequence[BaseMessage]) -> list[dict[str, str]]:
    """LangChain messages as plain chat-template dicts (``role``/``content`` only).

    Raises:
        ValueError: on a message type a chat template cannot take (e.g. tool calls).
    """
    chat = []
    for message in messages:
        role = ROLES.get(message.type)
        if role is None:
            raise ValueError(f"a chat template cannot take a '{message.type}' message")
        chat.append({"role": role, "content": message.text})
    return chat


def langchain_message(role: str, content: str, name: str | None = None) -> BaseMessage:
    """One episode-history message (OpenAI role, content, persona name) as the LangChain
    message the graph holds."""
    if role == "user":
        return HumanMessage(content)
    if role == "system":
        return SystemMessage(content)
    return AIMessage(content, name=name)
