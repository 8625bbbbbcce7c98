"""The one thinking setting of every prompt mascot renders.

Chat, the local server, candidates, the judge, GRPO/DPO/reward-model training and requests
to vLLM all render prompts with the same chat-template variables, so a policy is trained on
the prompts it later serves. Thinking is off: a Director's JSON or a persona's short reply
must not start inside ``<think>`` (Qwen3's templates think unless told not to; templates
without the switch ignore it).
"""

from __future__ import annotations

#: Whether prompts are rendered with the model's thinking mode on.
THINKING = False


def chat_template_kwargs(thinking: bool = THINKING) -> dict[str, bool]:
    """The chat-template variables every prompt is rendered with.

    Args:
        thinking: Turn the template's thinking mode on (Qwen3's ``enable_thinking``).

    Returns:
        ``{"enable_thinking": thinking}``, for ``apply_chat_template(**kwargs)``, TRL's
        ``chat_template_kwargs`` and vLLM's request field of the same name.
    """
    return {"enable_thinking": thinking}
