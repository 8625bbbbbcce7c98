"""The trained adapters that ship with the package: the learning run's Director and speakers.

``bench/learning.py`` trains a Director and a speakers' LoRA adapter on an offline model
(rank 8, a few megabytes each) and ships them here, one folder per offline model:
``<model>/speakers``, ``<model>/director`` and ``<model>/run.json`` (the roster they were
trained on, the run's steps and where its report is). ``mascot offline-model`` copies them
beside the model it builds and writes a ``policies.yaml`` that plays them, so a new user's
first command runs the trained ensemble; ``--model`` alone still runs the untrained one.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import yaml

#: Where the shipped adapters are: ``<offline model name>/<speakers|director>``.
SHIPPED = Path(__file__).resolve().parent
#: The adapters the run trains, by the roles that play them (``personas``: every persona).
ROLES = ("speakers", "director")
#: What of an adapter folder ships (the tokenizer files stay with the base model).
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_card.json")
#: The run's summary beside the adapters.
RUN_FILE = "run.json"


class TrainedError(ValueError):
    """A shipped or to-be-shipped adapter folder that is incomplete."""


def shipped_run(model: str, *, shipped: str | Path | None = None) -> dict[str, Any] | None:
    """The run summary of the adapters shipped for offline model ``model`` (``None`` when
    none, or an incomplete set, ship for it); ``shipped`` another folder than ``SHIPPED``."""
    folder = Path(shipped or SHIPPED) / model
    if not (folder / RUN_FILE).is_file() or any(not (folder / role / name).is_file()
                                                for role in ROLES for name in ADAPTER_FILES):
        return None
    return json.loads((folder / RUN_FILE).read_text(encoding="utf-8"))


def ship(adapters: str | Path, model: str, run: dict[str, Any], *, into: str | Path | None = None) -> Path:
    """Copy a run's trained adapters (``adapters/speakers``, ``adapters/director``, as
    ``mascot train-director`` leaves them) into ``into/<model>`` with ``run`` beside them.

    Raises:
        TrainedError: if an adapter file is missing.
    """
    source, target = Path(adapters), Path(into or SHIPPED) / model
    for role in ROLES:
        for name in ADAPTER_FILES:
            if not (source / role / name).is_file():
                raise TrainedError(f"{source / role} has no {name}: not a finished adapter")
    for role in ROLES:
        (target / role).mkdir(parents=True, exist_ok=True)
        for name in ADAPTER_FILES:
            shutil.copyfile(source / role / name, target / role / name)
        config = json.loads((target / role / "adapter_config.json").read_text(encoding="utf-8"))
        config["base_model_name_or_path"] = model  # not the path it was trained from
        (target / role / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    (target / RUN_FILE).write_text(json.dumps(run, indent=2) + "\n", encoding="utf-8")
    return target


def write_trained_policies(model_folder: str | Path, model: str, *,
                           shipped: str | Path | None = None) -> Path | None:
    """Copy the adapters shipped for offline model ``model`` into ``model_folder/adapters``
    and write ``model_folder/policies.yaml``: the roster's personas play the speakers'
    adapter, the Director its own, every other role (user simulator, judge) the base model.

    Returns:
        The policies file, or ``None`` when no adapters ship for ``model``.
    """
    folder, source = Path(model_folder).resolve(), Path(shipped or SHIPPED) / model
    run = shipped_run(model, shipped=shipped)
    if run is None:
        return None
    for link in (folder / "adapters", folder / "policies.yaml"):
        if link.is_symlink():  # a folder of links to another model folder: write here, never through the link
            link.unlink()
    for role in ROLES:
        (folder / "adapters" / role).mkdir(parents=True, exist_ok=True)
        for name in ADAPTER_FILES:
            shutil.copyfile(source / role / name, folder / "adapters" / role / name)
    base = {"kind": "local", "model": str(folder)}
    roles: dict[str, Any] = {"default": base}
    for persona in run.get("personas", []):
        roles[persona] = {**base, "adapter": "adapters/speakers", "version": run.get("version")}
    roles["director"] = {**base, "adapter": "adapters/director", "version": run.get("version")}
    path = folder / "policies.yaml"
    header = (f"# The trained ensemble of the learning run ({run.get('report', 'docs/learning/report.md')}): "
              f"trained on roster '{run.get('roster')}'.\n# The untrained model alone: --model {folder}\n")
    path.write_text(header + yaml.safe_dump({"version": 1, "roles": roles}, sort_keys=False), encoding="utf-8")
    return path
