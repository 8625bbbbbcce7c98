"""A vLLM server process (``VllmServer``): started with the command of ``command.py``, ready
when it answers, a failed start turned into one line taken from its log, and stopped with
every process it started (API server, engine core, workers), also on Ctrl-C.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Self

import httpx

from mascot.policies.allocator import allocator_env
from mascot.policies.serving import ServedPolicies
from mascot.policies.vllm.command import (
    VLLM_PYTHON_ENV,
    VLLM_VENV,
    CpuSettings,
    VllmError,
    cpu_settings,
    has_gpu,
    lora_modules,
    served_weights,
    vllm_command,
    vllm_python,
)

logger = logging.getLogger(__name__)

#: Seconds a server may take to answer (the CPU build spends ~100-120 s importing).
START_TIMEOUT = 900.0

_ERROR_LINE = re.compile(r"(Error|Exception|error:|CRITICAL)")


class VllmServer:
    """A vLLM server process for a policy set: started, ready, and stopped whole.

    Use as a context manager, or call ``start`` and ``stop``. Its log goes to a file
    (``log``), and to this process's stderr too with ``echo``.
    """

    def __init__(
        self,
        served: ServedPolicies,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        served_name: str | None = None,
        api_key: str | None = None,
        allow_runtime_lora: bool = False,
        max_loras: int | None = None,
        lora_rank: int | None = None,
        lora_target_modules: Sequence[str] | None = None,
        extra: Sequence[str] = (),
        echo: bool = False,
        log: str | Path | None = None,
        timeout: float = START_TIMEOUT,
        reserved_memory: int = 0,
    ) -> None:
        """Args:
            served: The base model and adapters.
            host: Interface to bind.
            port: Port; default a free one.
            served_name: The base model's name in requests; default the folder's name
                (its absolute path stays private), or the Hub id as given.
            api_key: The key every request must send (given to vLLM by its environment).
            allow_runtime_lora: Turn on the runtime load/unload endpoints.
            max_loras: Adapters in one batch (``vllm_command``).
            lora_rank: Largest adapter rank to take (``vllm_command``).
            lora_target_modules: The only modules that get LoRA (``vllm_command``).
            extra: More server arguments.
            echo: Copy the server's log to stderr as it is written.
            log: The log file; default a temporary file, kept after a failure.
            timeout: Seconds to wait for the server to answer.
            reserved_memory: Bytes promised to other servers on this CPU (``cpu_settings``).
        """
        self.served = served
        self.host = host
        self.port = port or _free_port()
        self.served_name = served_name or (Path(served.base).name if Path(served.base).is_dir() else served.base)
        self.api_key = api_key
        self.allow_runtime_lora = allow_runtime_lora
        self.max_loras = max_loras
        self.lora_rank = lora_rank
        # what the server will put LoRA on: as given, else its adapters' own modules
        self.lora_target_modules = (list(lora_target_modules) if lora_target_modules
                                    else lora_modules(served) if served.adapters else None)
        self.extra = list(extra)
        self.echo = echo
        self.log = Path(log) if log else None
        self.timeout = timeout
        self.reserved_memory = reserved_memory
        self.cpu: CpuSettings | None = None  # set by ``command`` on a CPU-only machine
        self.process: subprocess.Popen[bytes] | None = None
        self._pump: threading.Thread | None = None
        self.started_in: float | None = None

    @property
    def url(self) -> str:
        """The server's OpenAI-compatible ``.../v1`` URL."""
        return f"http://{self.host if self.host not in ('0.0.0.0', '::') else '127.0.0.1'}:{self.port}/v1"

    def memory(self) -> int:
        """Bytes of RAM this server takes on a CPU once busy (weights and KV cache); 0 on a
        GPU or before ``command``."""
        if self.cpu is None:
            return 0
        return served_weights(self.served.base, self.cpu.dtype) + (self.cpu.kv_cache_gib << 30)

    def command(self, python: str | None = None) -> tuple[list[str], dict[str, str]]:
        """The command line and added environment (the API key is not in either), with
        ``python`` or the vLLM environment's interpreter.

        Raises:
            VllmError: if no vLLM environment is found.
        """
        python = python or vllm_python()
        if python is None:
            raise VllmError(f"vLLM is not installed: run scripts/install --vllm (it makes {VLLM_VENV}), "
                            f"or set {VLLM_PYTHON_ENV} to the interpreter of an environment with vLLM")
        cpu = None if has_gpu() else cpu_settings(self.served.base, reserved=self.reserved_memory)
        self.cpu = cpu
        return vllm_command(self.served, python=python, host=self.host, port=self.port,
                            served_name=self.served_name, allow_runtime_lora=self.allow_runtime_lora,
                            max_loras=self.max_loras, lora_rank=self.lora_rank,
                            lora_target_modules=self.lora_target_modules, cpu=cpu, extra=self.extra)

    def start(self) -> Self:
        """Start the server and wait until ``/v1/models`` answers.

        Raises:
            VllmError: if vLLM is missing, exits while starting (the message has the
                cause from its log), or does not answer within ``timeout`` seconds.
        """
        argv, env = self.command()
        if self.log is None:
            handle, name = tempfile.mkstemp(prefix="mascot-vllm-", suffix=".log")
            os.close(handle)
            self.log = Path(name)
        # jemalloc where installed, as vLLM's CPU docs recommend (mascot.policies.allocator)
        child_env = {**allocator_env(mode="serve"), **env, "PYTHONUNBUFFERED": "1"}
        if self.api_key:
            child_env["VLLM_API_KEY"] = self.api_key
        logger.info("starting vLLM: %s", " ".join(argv))
        started = time.monotonic()
        handle = self.log.open("wb")
        self.process = subprocess.Popen(argv, env=child_env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        self._pump = threading.Thread(target=_copy, args=(self.process.stdout, handle, self.echo), daemon=True)
        self._pump.start()
        try:
            self._wait_ready(started)
        except BaseException:
            self.stop()
            raise
        self.started_in = round(time.monotonic() - started, 1)
        logger.info("vLLM ready at %s in %.0f s", self.url, self.started_in)
        return self

    def _wait_ready(self, started: float) -> None:
        assert self.process is not None
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        while time.monotonic() - started < self.timeout:
            code = self.process.poll()
            if code is not None:
                self._pump_done()
                raise VllmError(f"vLLM exited with code {code} while starting: {self.cause()} (log: {self.log})")
            try:
                if httpx.get(f"{self.url}/models", headers=headers, timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass  # not listening yet: the next poll tells
            time.sleep(1.0)
        raise VllmError(f"vLLM did not answer at {self.url} within {self.timeout:.0f} s (log: {self.log})")

    def cause(self) -> str:
        """The last error line of the server's log, or its last line."""
        if self.log is None:
            return "not started"
        try:
            lines = [line.strip() for line in self.log.read_text(encoding="utf-8", errors="replace").splitlines()]
        except OSError as exc:
            return f"no log ({exc})"
        lines = [line for line in lines if line]
        errors = [line for line in lines if _ERROR_LINE.search(line)]
        return (errors or lines or ["no output"])[-1][:300]

    def alive(self) -> bool:
        """Whether the server process is still running."""
        return self.process is not None and self.process.poll() is None

    def stop(self, grace: float = 30.0) -> None:
        """Stop the server and every process it started (SIGTERM, then SIGKILL after
        ``grace`` seconds); waits until none is left."""
        if self.process is None:
            return
        group = self.process.pid
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(group, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                self.process.poll()  # reap the leader, so that only living processes count
                if not _group_alive(group):
                    break
                time.sleep(0.2)
            self.process.poll()
            if not _group_alive(group):
                break
        self.process.wait()
        self._pump_done()

    def _pump_done(self) -> None:
        if self._pump is not None:
            self._pump.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def _copy(source: IO[bytes] | None, sink: IO[bytes], echo: bool) -> None:
    """Copy the server's output to its log file (and stderr with ``echo``) until it ends."""
    if source is None:
        return
    with sink:
        for line in iter(source.readline, b""):
            sink.write(line)
            sink.flush()
            if echo:
                sys.stderr.buffer.write(line)
                sys.stderr.buffer.flush()


def _group_alive(group: int) -> bool:
    """Whether any process of the group is left (the leader reaped first by ``poll``)."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
