"""The policy file that training writes: each trained adapter registered under its role.

Training commands register what they produce (role -> base model + adapter folder +
version) in a policy file, so ``mascot chat --policies FILE`` and
``Policies.from_file`` pick the new adapters up with no code change. The file is the same
format users write by hand (see ``mascot.policies.spec``); it is replaced atomically, and
a registration holds the file's lock (``.NAME.lock`` beside it) from reading to replacing,
so runs that register into one file at once each keep their entry.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from mascot.policies import PolicyError, load_policy_specs
from mascot.rosters import Roster
from mascot.rosters.yaml_file import read_yaml


def register_adapter(
    policy_file: str | Path,
    role: str,
    *,
    base: str,
    adapter: str | Path,
    roster: Roster,
    version: str | None = None,
) -> str:
    """Add or replace ``role``'s entry in a policy file (created if missing).

    Args:
        policy_file: The YAML policy file.
        role: A persona id or ``director``.
        base: The base model (Hub id or directory) the adapter was trained on.
        adapter: The PEFT adapter folder; stored relative to the file when it lies below it.
        roster: The roster whose roles are valid.
        version: Adapter version; default a UTC timestamp (``YYYYMMDD-HHMMSS``).

    Returns:
        The version registered.

    Raises:
        PolicyError: if the existing file is invalid, the role is unknown, or the adapter
            folder holds no PEFT adapter; the file is then left as it was.
    """
    path = Path(policy_file).expanduser()
    adapter = Path(adapter).expanduser().resolve()
    if not (adapter / "adapter_config.json").is_file():
        raise PolicyError(f"no PEFT adapter at {adapter} (adapter_config.json missing)")
    valid = ("director", *roster.persona_ids)
    if role not in valid:
        raise PolicyError(f"cannot register an adapter for role '{role}'; valid: {', '.join(valid)}")
    base = _model_reference(base, path)
    version = version or datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    folder = path.parent.resolve()
    where = os.path.relpath(adapter, folder) if adapter.is_relative_to(folder) else str(adapter)
    with _locked(path):
        # a new file answers the other roles with the bare base model
        data: dict[str, Any] = {"version": 1, "roles": {"default": {"kind": "local", "model": base}}}
        if path.exists():
            load_policy_specs(path, roster)  # refuse to build on an invalid file
            data = read_yaml(path)
            data.setdefault("roles", {})
        data["roles"][role] = {"kind": "local", "model": base, "adapter": where, "version": version}
        _replace(path, yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    return version


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Wait for, then hold, the policy file's lock: a read-modify-write of another run
    in between would drop one of the two entries."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with (path.parent / f".{path.name}.lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _model_reference(base: str, policy_file: Path) -> str:
    """A local base model as the policy file must name it (``./dir`` below the file, else
    absolute); a Hub id as it is."""
    local = Path(base).expanduser()
    if not local.is_dir():
        return base
    local, folder = local.resolve(), policy_file.parent.resolve()
    return f"./{os.path.relpath(local, folder)}" if local.is_relative_to(folder) else str(local)


def _replace(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=path.parent, prefix=f".{path.name}.",
                                         delete=False)
    try:
        with handle:
            handle.write(text)
        os.chmod(handle.name, 0o644)
        os.replace(handle.name, path)
    except BaseException:
        Path(handle.name).unlink(missing_ok=True)
        raise
