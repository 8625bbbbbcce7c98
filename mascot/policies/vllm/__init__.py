"""vLLM as the engine: where it is installed, its command line for a policy set, the server
process, and the pool of servers a command or a pipeline runs its policy sets on.

vLLM runs in its own virtualenv as a separate process, so this package imports without
torch (``mascot.policies.local`` is the in-process engine).
"""

from mascot.policies.vllm.command import (
    VLLM_PYTHON_ENV,
    VLLM_VENV,
    CpuSettings,
    VllmError,
    cpu_settings,
    has_gpu,
    vllm_command,
    vllm_python,
)
from mascot.policies.vllm.pool import VLLM_SERVERS_ENV, VllmPool, attached_servers, load_adapters, on_vllm
from mascot.policies.vllm.server import VllmServer

__all__ = [
    "VLLM_PYTHON_ENV",
    "VLLM_SERVERS_ENV",
    "VLLM_VENV",
    "CpuSettings",
    "VllmError",
    "VllmPool",
    "VllmServer",
    "attached_servers",
    "cpu_settings",
    "has_gpu",
    "load_adapters",
    "on_vllm",
    "vllm_command",
    "vllm_python",
]
