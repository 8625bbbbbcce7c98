"""What the training commands read, checked: episodes, pairs, sibling blocks, rejection-sampled
data and persona lists, each bad value a one-line ``UsageError`` naming its flag."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mascot.cli.options import UsageError
from mascot.rosters import Roster

#: Adapter name of one adapter shared by every persona.
SHARED_ADAPTER = "speakers"


def sample_jobs(path: str, keep: int, roster: Roster) -> list[tuple[str, Any, list[str], str]]:
    """The warm-start jobs of a samples file (``train-sft`` checked it exists): the speakers'
    and the Director's rows that passed."""
    from mascot.training.data.selection import select_rows
    from mascot.training.data.warm_start_samples import sample_counts
    from mascot.training.fitting.warm_start import WarmStartRows

    rows = select_rows(path, roster, keep=keep)  # the best of each context by the measured outcomes
    counts = sample_counts(path)
    jobs = []
    for name, role, roles in ((SHARED_ADAPTER, "speakers", list(roster.persona_ids)),
                              ("director", "director", ["director"])):
        faults: dict[str, int] = {}
        for key, row in counts.items():
            if key.endswith(f"/{role}"):
                for fault, n in row.items():
                    if fault not in ("sampled", "passed"):
                        faults[fault] = faults.get(fault, 0) + n
        if rows[role]:
            contexts = len({r["context_id"] for r in rows[role]})
            jobs.append((name, WarmStartRows(rows=rows[role], contexts=contexts, faults=faults), roles, path))
    if not jobs:
        raise UsageError(f"--samples: no sample in {path} passed the checks")
    return jobs


def blocks(path: str) -> list[Any]:
    """The sibling blocks of ``--blocks`` (``train-sft`` checked the file exists)."""
    from mascot.training.data.sibling_blocks import SiblingBlockError, read_block_candidates

    try:
        return read_block_candidates(path)
    except SiblingBlockError as exc:
        raise UsageError(f"--blocks: {exc}") from None


def director_prompts(path: str, roster: Roster) -> dict[str, Any]:
    from mascot.training.data.block_rollout import decision_points

    return {p.context_id: p.prompt for p in decision_points(episodes(path, roster), roster)}


def has_turns(episodes: list[Any], persona: str) -> bool:
    return any(m.name == persona and m.stage_direction for e in episodes for m in e.messages)


def personas(ids: list[str], roster: Roster) -> list[str]:
    unknown = [i for i in ids if i not in roster.persona_ids]
    if unknown:
        raise UsageError(f"--personas: unknown persona(s) {', '.join(unknown)}; valid: {', '.join(roster.persona_ids)}")
    return list(ids) or list(roster.persona_ids)


def episodes(path: str, roster: Roster | None = None) -> list[Any]:
    from mascot.training.episodes.episode import read_episodes

    if not Path(path).is_file():
        raise UsageError(f"--episodes: no such file {path}")
    episodes = read_episodes(path)
    if not episodes:
        raise UsageError(f"--episodes: no episodes in {path}")
    others = sorted({e.roster for e in episodes} - {roster.id}) if roster else []
    if others:
        raise UsageError(f"--episodes: episodes of roster(s) {', '.join(others)}, not '{roster.id}'")
    return episodes


def pairs(where: str | None, flag: str = "--pairs") -> list[dict[str, Any]]:
    from mascot.training.data.pairs import read_pairs

    if not where:
        raise UsageError("--method dpo needs --pairs DIR (from mascot pairs) or a pairs JSONL file")
    path = pairs_file(where)
    if not path.is_file():
        raise UsageError(f"{flag}: no such file {path}")
    rows = read_pairs(path)
    if not rows:
        raise UsageError(f"{flag}: no pairs in {path}")
    return rows


def pairs_file(where: str) -> Path:
    """The pairs file a ``--pairs`` value names: a file, or ``train.jsonl`` in a folder."""
    path = Path(where)
    return path / "train.jsonl" if path.is_dir() else path
