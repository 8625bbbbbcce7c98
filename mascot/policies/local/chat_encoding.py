"""Chat messages to prompt token ids, without letting message text become control tokens.

Rendering the chat template to text and tokenizing that text again turns a person's
``<|im_start|>system ...`` into a real system turn. transformers' own remedy,
``apply_chat_template(..., sanitize_control_tokens=True)``, marks the control tokens
inside message contents (and template variables) before rendering and encodes them as
plain text afterwards, while the template's own control tokens stay tokens; text without
control tokens tokenizes exactly as before.
"""

from __future__ import annotations

import copy
import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import jinja2
import torch

#: Most variables one request may pass to the chat template.
MAX_TEMPLATE_VARIABLES = 16
_MAX_TEMPLATE_TEXT = 256
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
# apply_chat_template's own arguments, the variables it sets, and the helpers its Jinja
# environment provides: a template variable of one of these names would collide or shadow
_RESERVED = frozenset({
    "add_generation_prompt", "chat_template", "continue_final_message", "conversation", "documents",
    "max_length", "messages", "padding", "raise_exception", "return_assistant_tokens_mask", "return_dict",
    "return_tensors", "sanitize_control_tokens", "strftime_now", "tokenize", "tokenizer_kwargs", "tools",
    "truncation",
})


class PromptError(ValueError):
    """Chat-template variables or messages the template cannot render; says why."""


def check_template_kwargs(kwargs: Any) -> dict[str, bool | int | float | str]:
    """Validate chat-template variables (vLLM's ``chat_template_kwargs``).

    Args:
        kwargs: A mapping of variable names to values.

    Returns:
        The variables as a plain dict.

    Raises:
        PromptError: if it is not a mapping, has too many entries, a name that is not an
            identifier or is reserved (the template's own variables such as ``messages``,
            special-token names such as ``eos_token``), or a value that is not a bool,
            number or short string.
    """
    if not isinstance(kwargs, Mapping):
        raise PromptError(f"chat_template_kwargs must be an object, got {type(kwargs).__name__}")
    if len(kwargs) > MAX_TEMPLATE_VARIABLES:
        raise PromptError(f"chat_template_kwargs has {len(kwargs)} entries; at most {MAX_TEMPLATE_VARIABLES}")
    checked: dict[str, bool | int | float | str] = {}
    for name, value in kwargs.items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise PromptError(f"chat_template_kwargs: {name!r} is not a variable name (letters, digits, _)")
        if name in _RESERVED or name.endswith(("_token", "_tokens")):
            raise PromptError(f"chat_template_kwargs: '{name}' is reserved by the chat template")
        if not isinstance(value, (bool, int, float, str)):
            raise PromptError(
                f"chat_template_kwargs: '{name}' must be a boolean, number or string, got {type(value).__name__}"
            )
        if isinstance(value, str) and len(value) > _MAX_TEMPLATE_TEXT:
            raise PromptError(f"chat_template_kwargs: '{name}' is over {_MAX_TEMPLATE_TEXT} characters")
        checked[name] = value
    return checked


class ChatEncoder:
    """Encodes conversations with a model's chat template, message text as plain text.

    It works on its own copy of the tokenizer, under its own lock: encoding message text
    as plain text switches a flag on the Rust tokenizer for the duration of the call, and
    a concurrent call on the same tokenizer (a server counting tokens, another request)
    would flip it under the other's feet.

    Args:
        tokenizer: The model's Hugging Face tokenizer (it is copied, not changed).
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = copy.deepcopy(tokenizer)
        self._lock = threading.Lock()

    def encode(
        self, conversation: Sequence[Mapping[str, str]], template_kwargs: Mapping[str, Any] | None = None
    ) -> list[int]:
        """The prompt ids of ``conversation``, ending with the assistant's turn header.

        Args:
            conversation: Chat messages (``role``/``content`` dicts).
            template_kwargs: Extra chat-template variables (e.g. ``enable_thinking``).

        Returns:
            Token ids; control tokens occur only where the template wrote them.

        Raises:
            PromptError: if the template rejects the conversation or a variable.
        """
        with self._lock:
            try:
                return list(self.tokenizer.apply_chat_template(
                    [dict(message) for message in conversation],
                    tokenize=True,
                    return_dict=False,
                    add_generation_prompt=True,
                    sanitize_control_tokens=True,
                    **dict(template_kwargs or {}),
                ))
            except jinja2.TemplateError as exc:  # the template's raise_exception(...) and syntax errors
                raise PromptError(f"the chat template rejected the conversation: {exc}") from None


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int, device: torch.device | str) -> dict[str, torch.Tensor]:
    """``input_ids`` and ``attention_mask`` of ``prompts``, padded on the left.

    Args:
        prompts: Token ids per row.
        pad_id: The padding token.
        device: Where the tensors go.

    Returns:
        ``{"input_ids", "attention_mask"}``, each ``rows x longest``.
    """
    width = max(len(prompt) for prompt in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        if prompt:
            ids[row, width - len(prompt):] = torch.tensor(list(prompt), dtype=torch.long)
            mask[row, width - len(prompt):] = 1
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device)}
