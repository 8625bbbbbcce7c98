"""Rejection-sampled warm-start data: what each check keeps out, the counts per source, resuming."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from fakes import PromptChat, digest

from mascot.graphs.embeddings import LexicalEmbedder
from mascot.rosters import Roster
from mascot.training.data.block_rollout import decision_points
from mascot.training.data.candidates import candidate_contexts
from mascot.training.data.selection import select_rows
from mascot.training.data.warm_start_samples import (
    direction_fault,
    reply_sample_fault,
    sample_counts,
    sample_warm_start,
)

GOOD = {"speaker": "catalyst", "action": "Ask what they think actually went wrong on the day", "tone": "calm, curious"}


def test_direction_checks(roster: Roster, episodes: list) -> None:
    point = next(p for p in decision_points(episodes, roster) if p.round_turns == 0)
    person = next(m["content"] for m in point.prompt if m["role"] == "user").split("Conversation so far:")[-1]
    cases = {
        json.dumps(GOOD): None,
        "I'm sorry, but I can't help with that.": "invalid",  # no JSON: the graph replaces it
        json.dumps({**GOOD, "speaker": "The Catalyst"}): "repaired",
        json.dumps({**GOOD, "action": "I'm sorry, but I can't assist with that request."}): "refusal",
        json.dumps({**GOOD, "action": "As an AI language model I suggest a question"}): "refusal",
        json.dumps({**GOOD, "action": "Respond."}): "short_action",
        json.dumps({**GOOD, "action": person.strip()[:400]}): "copied",
        json.dumps({**GOOD, "action": f"Say: {roster.director.guidance[:200]}"}): "copied",
        json.dumps({**GOOD, "tone": "The tone should be warm and gentle and kind to them"}): "long_tone",
        json.dumps({**GOOD, "tone": ""}): "repaired",  # a missing tone is filled in by the graph
        json.dumps({**GOOD, "action": "I will be able to get better again."}): "first_person",
        json.dumps({**GOOD, "action": "The Catalyst, the critical thinker"}): "names_voice",
        json.dumps({**GOOD, "action": "Oh no! I'm sorry, but I can't help you with that."}): "refusal",
    }
    assert {text: direction_fault(text, point, roster) for text in cases} == cases
    assert direction_fault(json.dumps({"speaker": "user", "action": "", "tone": ""}), point, roster) == "invalid"


def test_reply_checks(roster: Roster, episodes: list) -> None:
    context = next(c for c in candidate_contexts(episodes, roster) if c.persona == "anchor")
    person = next(m["content"] for m in reversed(context.context) if m["role"] == "user")
    cases = {
        "That sounds exhausting, and it makes sense that you want to hide for a while.": None,
        "": "empty",
        "I'm sorry, but I can't assist with that.": "refusal",
        "How can I assist you today?": "helpdesk",
        f"User: {person}": "as_person",
        "It sounds like you feel let down and a bit embarrassed.": "copies_style",  # the roster's own example
        "Oh no! I'm sorry, but I can't help you with that.": "refusal",  # after an interjection
        "Sure, I'd be happy to help. What would you like me to do?": "helpdesk",
        f"Tone: warm. {context.direction.action}": "echoes_prompt",
    }
    assert {text: reply_sample_fault(text, context, roster) for text in cases} == cases


def test_sampling_counts_each_source_keeps_what_passes_and_resumes(roster: Roster, episodes: list,
                                                                    tmp_path: Path) -> None:
    points = decision_points(episodes, roster)[:3]
    contexts = candidate_contexts(episodes, roster)[:3]
    calls = {"policy": 0, "teacher": 0}

    def model(name: str, refuse_every: int) -> PromptChat:
        def reply(prompt: str) -> str:
            calls[name] += 1
            if digest(prompt + str(calls[name])) % refuse_every == 0:
                return "I'm sorry, but I can't help with that."
            if "Reply with one JSON object" in prompt:
                return json.dumps({**GOOD, "speaker": roster.persona_ids[calls[name] % 4],
                                   "action": f"Ask one question about the day number {calls[name]} they mentioned"})
            return f"I hear how heavy this is ({name} {calls[name]}), and it makes sense that it hurts."
        return PromptChat(reply=reply)

    sources = {name: dict.fromkeys(["director", *roster.persona_ids], model(name, every))
               for name, every in (("policy", 2), ("teacher", 1000))}
    out = tmp_path / "samples.jsonl"
    report = asyncio.run(sample_warm_start(points, contexts, roster, sources, k=3, out=out))
    assert sum(r["sampled"] for r in report.counts.values()) == 2 * 3 * 6 == len(out.read_text().splitlines())
    assert report.counts == sample_counts(out)
    assert report.counts["policy/director"]["passed"] < report.counts["teacher/director"]["passed"]
    rows = select_rows(out, roster, keep=2, embedder=LexicalEmbedder())
    assert len(rows["director"]) <= 2 * len(points) and len(rows["speakers"]) <= 2 * len(contexts)
    assert rows["director"] and rows["speakers"]
    for row in rows["director"]:
        direction = json.loads(row["completion"][0]["content"])
        assert set(direction) == {"speaker", "action", "tone"} and "sorry" not in direction["action"]
    assert all("sorry" not in row["completion"][0]["content"] for row in rows["speakers"])
    # a rerun draws nothing again; a larger k draws only the new samples
    again = asyncio.run(sample_warm_start(points, contexts, roster, sources, k=3, out=out))
    assert again.counts == {} and again.skipped == 36
    more = asyncio.run(sample_warm_start(points, contexts, roster, sources, k=4, out=out))
    assert sum(r["sampled"] for r in more.counts.values()) == 12 and more.skipped == 36
    with pytest.raises(ValueError, match="source 'policy' has no model for director"):
        asyncio.run(sample_warm_start(points, [], roster, {"policy": {"anchor": sources["policy"]["anchor"]}},
                                      k=1, out=tmp_path / "other.jsonl"))
    with pytest.raises(ValueError, match="keep=0"):
        select_rows(out, roster, keep=0)


def test_directions_are_sampled_as_the_graph_asks_structured_over_the_voices_offered(roster: Roster, episodes: list,
                                                                                    tmp_path: Path) -> None:
    from langchain_core.messages import AIMessage
    from langchain_core.runnables import RunnableLambda

    from mascot.graphs.state import offered_speakers

    asked: list[tuple[str, ...]] = []

    class Structured(PromptChat):
        def with_structured_output(self, schema, **kwargs):  # noqa: ANN001, ANN003, ANN201
            enum = tuple(schema["properties"]["speaker"]["enum"])
            asked.append(enum)
            text = json.dumps({**GOOD, "speaker": enum[0]})
            return RunnableLambda(lambda _: {"raw": AIMessage(text), "parsed": json.loads(text),
                                             "parsing_error": None})

    chat = Structured(reply=lambda p: "I'm sorry, but I can't help with that.")  # the unstructured call refuses
    points = decision_points(episodes, roster)[:3]
    out = tmp_path / "samples.jsonl"
    report = asyncio.run(sample_warm_start(points, [], roster, {"policy": {"director": chat}}, k=1, out=out))
    assert report.counts["policy/director"]["passed"] >= 1
    assert [set(a) for a in asked] == [set(offered_speakers(roster, p.messages, round_turns=p.round_turns,
                                                             min_speakers_per_round=1, seed=0)) for p in points]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(json.loads(row["completion"])["speaker"] in asked[0] + asked[1] + asked[2] for row in rows)
