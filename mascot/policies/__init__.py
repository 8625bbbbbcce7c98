"""Which model answers for which role: OpenAI-compatible endpoints or the local backend.

The local backend (``mascot.policies.local``) needs the ``train`` extra (torch); import
it from its module. Everything here imports without torch.
"""

from mascot.policies.policy_set import Policies, openai_chat_model
from mascot.policies.spec import (
    FIXED_ROLES,
    ROLE_MAX_TOKENS,
    SPEAKER_MAX_TOKENS,
    PolicyError,
    PolicySpec,
    load_policy_specs,
)

__all__ = [
    "FIXED_ROLES",
    "ROLE_MAX_TOKENS",
    "SPEAKER_MAX_TOKENS",
    "Policies",
    "PolicyError",
    "PolicySpec",
    "load_policy_specs",
    "openai_chat_model",
]
