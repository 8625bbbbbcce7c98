"""A generated reply of the local backend, and the cut at a stop string.

Batched and streamed replies both end as these: the text with its token counts, which the
local server reports as the request's usage.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Generation:
    """One generated reply with its token counts."""

    text: str
    prompt_tokens: int
    completion_tokens: int


def cut_at_stop(text: str, stop: Sequence[str] | None) -> str:
    """``text`` up to the first of the ``stop`` strings it holds."""
    for marker in stop or ():
        index = text.find(marker)
        if index >= 0:
            text = text[:index]
    return text
