"""What a server serves from a policy file, and reloading adapters into it.

A server holds one base model and the LoRA adapters of the file's ``local`` roles, each
served under its folder's name (``adapters/anchor`` -> model ``anchor``; an adapter
shared by several roles is served once). ``mascot.policies.vllm`` runs vLLM for it;
``reload_adapters`` pushes new adapter versions into a running
server (vLLM or ``mascot serve``) through vLLM's runtime endpoints; ``client_policies``
is the policy file that points every role at the server, for ``mascot chat --policies``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from mascot.policies.spec import PolicyError, PolicySpec, load_policy_specs


@dataclass(frozen=True)
class ServedAdapter:
    """One adapter of a server: its served name, folder, version and the roles using it."""

    name: str
    path: Path
    version: str | None
    roles: tuple[str, ...]


@dataclass(frozen=True)
class ServedPolicies:
    """The base model and adapters a policy file asks a server for.

    Attributes:
        base: The base model (Hub id or absolute folder).
        adapters: Served adapters by name.
        roles: Every ``local`` role of the file -> its adapter name, or ``None`` for the base.
        source: The policy file.
    """

    base: str
    adapters: dict[str, ServedAdapter] = field(default_factory=dict)
    roles: dict[str, str | None] = field(default_factory=dict)
    source: Path | None = None

    @classmethod
    def from_file(cls, path: str | Path) -> ServedPolicies:
        """Read a policy file's ``local`` roles.

        Raises:
            PolicyError: on an invalid file, no ``local`` role, roles on different base
                models, or two adapter folders with the same name.
        """
        return cls.from_specs(load_policy_specs(path, None), source=Path(path))

    @classmethod
    def from_specs(cls, specs: Mapping[str, PolicySpec], *, source: Path | None = None) -> ServedPolicies:
        """The ``local`` roles of a set of specs (see ``from_file``; errors name ``source``).

        Raises:
            PolicyError: on no ``local`` role, roles on different base models, or two
                adapter folders with the same name.
        """
        path = source or "the policies"
        specs = {role: spec for role, spec in specs.items() if spec.kind == "local"}
        if not specs:
            raise PolicyError(f"{path}: no role of kind 'local' to serve")
        bases = sorted({spec.model for spec in specs.values()})
        if len(bases) > 1:
            raise PolicyError(f"{path}: one server serves one base model; the roles use {', '.join(bases)}")
        adapters: dict[str, ServedAdapter] = {}
        roles: dict[str, str | None] = {}
        for role, spec in specs.items():
            if not spec.adapter:
                roles[role] = None
                continue
            folder = Path(spec.adapter)
            name = folder.name
            known = adapters.get(name)
            if known is not None and known.path != folder:
                raise PolicyError(f"{path}: two adapters named '{name}' ({known.path} and {folder}); "
                                  "rename one folder")
            roles_of = (*known.roles, role) if known else (role,)
            adapters[name] = ServedAdapter(name=name, path=folder, version=spec.version, roles=roles_of)
            roles[role] = name
        return cls(base=bases[0], adapters=adapters, roles=roles, source=source)


def reload_adapters(
    base_url: str,
    served: ServedPolicies,
    *,
    api_key: str | None = None,
    client: httpx.Client | None = None,
) -> list[str]:
    """Load the policy file's adapters into a running server, replacing those of the same name.

    Each adapter is unloaded (when loaded) and loaded again from its folder through vLLM's
    ``/v1/unload_lora_adapter`` and ``/v1/load_lora_adapter``; the server must allow
    runtime loading (``--allow-runtime-lora``). Paths are sent as absolute folders.

    Args:
        base_url: The server's ``.../v1`` URL.
        served: The adapters to load.
        api_key: Bearer token, if the server needs one.
        client: HTTP client (tests); default a new one.

    Returns:
        The names loaded.

    Raises:
        PolicyError: if the server refuses a load (the message has the server's reason).
    """
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    http = client or httpx.Client(timeout=300.0)
    url = base_url.rstrip("/")
    try:
        listed = http.get(f"{url}/models", headers=headers)
        _raise_for(listed, "list models")
        loaded = {m["id"] for m in listed.json().get("data", [])}
        for adapter in served.adapters.values():
            if adapter.name in loaded:
                _raise_for(http.post(f"{url}/unload_lora_adapter", json={"lora_name": adapter.name},
                                     headers=headers), f"unload '{adapter.name}'")
            _raise_for(http.post(f"{url}/load_lora_adapter", headers=headers,
                                 json={"lora_name": adapter.name, "lora_path": str(adapter.path)}),
                       f"load '{adapter.name}'")
    except httpx.HTTPError as exc:
        raise PolicyError(f"cannot reach the server at {base_url}: {exc}") from None
    finally:
        if client is None:
            http.close()
    return list(served.adapters)


def client_policies(served: ServedPolicies, base_url: str, *, api_key_env: str | None = None) -> dict[str, Any]:
    """A policy file (as data) that points every served role at the server by model name."""
    roles: dict[str, Any] = {}
    for role, name in served.roles.items():
        entry: dict[str, Any] = {"kind": "openai", "base_url": base_url, "model": name or served.base}
        if name and served.adapters[name].version:
            entry["version"] = served.adapters[name].version
        if api_key_env:
            entry["api_key_env"] = api_key_env
        roles[role] = entry
    return {"version": 1, "roles": roles}


def _raise_for(response: httpx.Response, action: str) -> None:
    if response.status_code >= 400:
        try:
            reason = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            reason = response.text[:200]
        raise PolicyError(f"the server refused to {action} ({response.status_code}): {reason}")
