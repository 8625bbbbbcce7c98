"""The vLLM servers of one command or one pipeline (``VllmPool``): one per base model, the
adapters of each policy set loaded into it at run time, running servers attached through
``$MASCOT_VLLM_SERVERS``; and ``on_vllm``, one policy set on a server for a block.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import TracebackType
from typing import Self

import httpx

from mascot.policies.policy_set import Policies
from mascot.policies.serving import ServedAdapter, ServedPolicies
from mascot.policies.spec import PolicyError, PolicySpec
from mascot.policies.vllm.command import VllmError, has_gpu, lora_modules
from mascot.policies.vllm.server import VllmServer

#: Variable naming running vLLM servers to use instead of starting one (``VllmPool``).
VLLM_SERVERS_ENV = "MASCOT_VLLM_SERVERS"
#: Adapters in one batch on a server started with runtime LoRA (a roster's voices and the Director).
DEFAULT_MAX_LORAS = 8
#: Seconds per request to a pool's server on a CPU-only machine, for a role that sets none:
#: two cores prefilling a judge's 3,000-token prompt behind eight others pass the usual 60 s.
CPU_REQUEST_TIMEOUT = 600.0


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

    @classmethod
    def shared(
        cls,
        owner: object,
        cleanup: ExitStack,
        *,
        echo: bool = False,
        announce: Callable[[str], None] | None = None,
    ) -> VllmPool:
        """The pool one command shares between its policy sets (and the judge's): kept on
        ``owner`` as ``owner.vllm_pool`` (the command's parsed arguments), made the first
        time and closed by ``cleanup`` when the command ends.

        Args:
            owner: Holds the pool between calls (``vllm_pool``; ``None`` or absent at first).
            cleanup: The command's exit stack; it closes the pool.
            echo: Copy the servers' logs to stderr.
            announce: Told a line when a server starts and when it is ready.

        Raises:
            VllmError: if ``$MASCOT_VLLM_SERVERS`` is not a JSON object of URLs.
        """
        pool = getattr(owner, "vllm_pool", None)
        if pool is None:
            pool = cleanup.enter_context(cls(echo=echo, announce=announce))
            setattr(owner, "vllm_pool", pool)  # noqa: B010 - owner is any object, not a typed holder
        return pool

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

    def stage_env(self, bases: Sequence[str], env: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment of a pipeline stage that generates on ``bases``: ``env`` (default
        this process's) with ``$MASCOT_VLLM_SERVERS`` naming their servers, started if needed
        after the servers of other bases are stopped (``keep``), so the stage has their memory.

        Raises:
            VllmError: if vLLM is missing or fails to start.
        """
        self.keep(bases)
        urls = {model: self.url(model) for model in bases}
        return {**(env if env is not None else os.environ), VLLM_SERVERS_ENV: json.dumps(urls)}

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

