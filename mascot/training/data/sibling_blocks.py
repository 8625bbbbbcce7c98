"""Sibling blocks: G continuations of one Director decision point, the group reward model's data.

Director GRPO compares the G blocks that follow G sampled directions at the same decision
point (``DirectorRewards``). The group reward model is trained on the same comparison: at
each decision point of a set of episodes, ``sample_sibling_blocks`` lets the Director
decide G times with different sampling seeds and plays each decision for ``block_turns``
turns (``BlockRollout``); the group rubric judges every block, and ``mascot pairs`` pairs
the blocks of one decision point with each other (``context_id`` is the point), holding
out whole points for testing. The prefix keeps who said what (messages with ``name``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from mascot.rosters import Roster
from mascot.training.jsonl import JsonlAppender, JsonlError, check_writable, exclusive, read_records
from mascot.training.judging.targets import BlockTarget, conversation_turns, render_block

if TYPE_CHECKING:  # reading and judging blocks needs no model (the rollout loads torch)
    from mascot.training.data.block_rollout import BlockRollout, DecisionPoint

logger = logging.getLogger(__name__)


class SiblingBlockError(ValueError):
    """A sibling block file cannot be read or written; the message is one line."""


class BlockCandidate(BaseModel):
    """One block played after a decision point (one JSONL line of ``mascot blocks``).

    Attributes:
        context_id: The decision point; the blocks of one point compete.
        episode_id: The episode the prefix comes from.
        cut: Messages in the prefix.
        sample: Index of the block at its point (0..G-1).
        prompt: The prefix as OpenAI messages with persona ``name`` s.
        turns: The block's turns (OpenAI messages with ``name``).
        direction: The Director's decision at the point, as the graph read it.
        validity: ``valid``, ``repaired`` or ``replaced``.
    """

    model_config = ConfigDict(extra="forbid")

    context_id: str = Field(min_length=1)
    episode_id: str
    cut: int = Field(ge=1)
    sample: int = Field(ge=0)
    prompt: list[dict[str, Any]] = Field(min_length=1)
    turns: list[dict[str, Any]]
    direction: dict[str, Any]
    validity: str

    @property
    def reply(self) -> str:
        """The block as the group reward model reads it (``speaker: text`` paragraphs)."""
        return render_block(self.turns)

    def target(self, roster: Roster) -> BlockTarget:
        """The block as a group-rubric judge target (``sample`` tells the siblings apart)."""
        return BlockTarget(episode_id=self.context_id, start=self.cut, end=self.cut + len(self.turns),
                           sample=self.sample, personas=list(roster.personas),
                           context=conversation_turns(self.prompt, roster),
                           block=conversation_turns(self.turns, roster))


@dataclass
class SiblingReport:
    """What a ``sample_sibling_blocks`` run did."""

    points: int
    wanted: int
    skipped: int
    written: int = 0
    empty: int = 0


def sample_sibling_blocks(
    points: Sequence[DecisionPoint],
    rollout: BlockRollout,
    *,
    g: int,
    out: str | Path,
    batch: int = 8,
    on_progress: Callable[[SiblingReport], None] = lambda report: None,
) -> SiblingReport:
    """Play ``g`` blocks at every point and append them to ``out``; resumable.

    Blocks already in ``out`` (same point and sample) are skipped; a block with no turn (the
    conversation ended at once) is counted as ``empty`` and not written.

    Args:
        points: Decision points (``decision_points`` of the episodes).
        rollout: Plays the blocks; its continuation Director decides at the point too.
        g: Blocks per point (at least 2, or nothing competes).
        out: JSONL file, appended.
        batch: Blocks played at once (the rollout's concurrency bounds it too).
        on_progress: Called after each batch.

    Raises:
        ValueError: if ``g`` < 2.
        SiblingBlockError: if ``out`` cannot be written or holds something else.
    """
    if g < 2:
        raise ValueError(f"g={g}: sibling blocks need at least 2 per decision point")
    try:
        path = check_writable(out)
        with exclusive(path), JsonlAppender(path) as sink:
            done = {(c.context_id, c.sample) for c in read_block_candidates(path)} if path.is_file() else set()
            todo = [(p, s) for p in points for s in range(g) if (p.context_id, s) not in done]
            report = SiblingReport(points=len(points), wanted=len(points) * g, skipped=len(points) * g - len(todo))
            for start in range(0, len(todo), batch):
                chunk = todo[start : start + batch]
                # the index of a block in run() seeds its sampling: the sample number keeps it stable on resume
                blocks = rollout.run_samples([p for p, _ in chunk], [s for _, s in chunk])
                for (point, sample), block in zip(chunk, blocks, strict=True):
                    if not block.turns:
                        report.empty += 1
                        continue
                    sink.write(BlockCandidate(
                        context_id=point.context_id, episode_id=point.episode_id, cut=point.cut, sample=sample,
                        prompt=point.chat(), turns=block.turns,
                        direction=block.direction.model_dump(exclude_none=True), validity=block.validity,
                    ).model_dump(mode="json"))
                    report.written += 1
                on_progress(report)
    except JsonlError as exc:
        raise SiblingBlockError(str(exc)) from None
    logger.info("sibling blocks: %d written, %d empty, %d already there", report.written, report.empty,
                report.skipped)
    return report


def read_block_candidates(path: str | Path) -> list[BlockCandidate]:
    """Read a sibling block file written by ``sample_sibling_blocks``.

    Raises:
        SiblingBlockError: if a line is not a block (the message names file and line).
    """
    blocks = []
    try:
        blocks.extend(block for _, block in read_records(path, BlockCandidate, "a sibling block"))
    except JsonlError as exc:
        raise SiblingBlockError(str(exc)) from None
    return blocks
