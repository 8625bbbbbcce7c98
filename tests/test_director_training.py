"""Director GRPO: decision points, blocks played in the real graph, block rewards, real TRL steps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fakes import PromptChat, director_fake, speaker_fake
from transformers import TrainerCallback

from mascot.graphs.embeddings import LexicalEmbedder
from mascot.graphs.state import round_speakers
from mascot.rosters import Roster
from mascot.training.data.block_rollout import BlockRollout, decision_points
from mascot.training.fitting.director_rewards import EMPTY_BLOCK_REWARD, DirectorRewards, standardise_by_group
from mascot.training.fitting.director_training import DirectorTrainingConfig, train_director


class Logs(TrainerCallback):
    """Every dict the trainer logs."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        self.entries.append(dict(logs or {}))


class BlockScorer:
    """A group reward model stand-in: records what it scored, rewards longer blocks."""

    def __init__(self) -> None:
        self.calls: list[tuple[list, list]] = []

    def score_blocks(self, contexts: list, blocks: list) -> list[float]:
        self.calls.append((contexts, blocks))
        return [float(len(block)) for block in blocks]


def persona_voice(persona: str) -> PromptChat:
    return PromptChat(reply=lambda prompt: f"{persona} says something about it")


def rollout_for(roster: Roster, block_turns: int = 2) -> BlockRollout:
    return BlockRollout(roster, speakers={p: persona_voice(p) for p in roster.persona_ids},
                        director=director_fake(roster.persona_ids), user=speaker_fake(), block_turns=block_turns)


def test_decision_points_follow_the_graph(roster: Roster, episodes: list) -> None:
    points = decision_points(episodes, roster, max_speakers_per_round=3)
    assert points and len({p.context_id for p in points}) == len(points)
    for point in points:
        last = point.messages[-1]
        assert last.type == "human" or last.name in roster.persona_ids
        assert 0 <= point.round_turns < 3
        assert point.prompt[0]["role"] == "system" and "Director" in point.prompt[0]["content"]
    assert any(p.round_turns == 0 for p in points) and any(p.round_turns > 0 for p in points)
    assert len(decision_points(episodes, roster, max_speakers_per_round=1)) < len(points)


def test_blocks_are_played_in_the_graph(roster: Roster, episodes: list) -> None:
    points = decision_points(episodes, roster)
    mid = next(p for p in points if p.round_turns > 0)
    rollout = rollout_for(roster, block_turns=2)
    target = next(pid for pid in reversed(roster.persona_ids) if pid not in round_speakers(list(mid.messages)))
    directions = [json.dumps({"speaker": target, "action": "challenge", "tone": "calm"}),
                  json.dumps({"speaker": roster.persona(target).name, "action": "challenge"}),
                  "I think the next speaker should be someone",
                  json.dumps({"speaker": "nobody", "action": "x", "tone": "y"})]
    blocks = rollout.run([points[0], mid, mid, points[0]], directions)
    rollout.close()
    assert [b.validity for b in blocks] == ["valid", "repaired", "replaced", "replaced"]
    assert blocks[0].turns[0] == {"role": "assistant", "name": target, "content": f"{target} says something about it"}
    assert blocks[1].turns[0]["name"] == target
    assert all(len(b.turns) == 2 for b in blocks)
    # a replaced direction still plays, with the graph's fallback speaker
    assert blocks[2].turns[0]["name"] in roster.persona_ids and blocks[2].direction.fallback


def test_block_rewards(roster: Roster, episodes: list) -> None:
    points = decision_points(episodes, roster)
    rollout, scorer = rollout_for(roster), BlockScorer()
    rewards = DirectorRewards(points, rollout, group_rm=scorer, embedder=LexicalEmbedder())
    good = json.dumps({"speaker": roster.persona_ids[1], "action": "ask", "tone": "warm"})
    completions = [[{"role": "assistant", "content": text}] for text in (good, "not json at all")]
    ids = [points[0].context_id] * 2
    prompts = [list(points[0].prompt)] * 2
    assert rewards.direction_validity(prompts, completions, context_id=ids) == [0.0, -1.0]
    scores = rewards.group_reward_model(prompts, completions, context_id=ids)
    balance = rewards.speaker_balance(prompts, completions, context_id=ids)
    penalty = rewards.redundancy_penalty(prompts, completions, context_id=ids)
    rollout.close()
    assert len(scorer.calls) == 1  # blocks were played once and shared by every term
    contexts, blocks = scorer.calls[0]
    assert contexts[0] == points[0].chat() and blocks[0][0]["name"] == roster.persona_ids[1]
    logits = [float(len(b)) for b in blocks]
    # standardised within the decision point: +1 for the longer block, -1 for the shorter, 0 when equal
    assert scores == ([0.0, 0.0] if logits[0] == logits[1] else [1.0, -1.0] if logits[0] > logits[1] else [-1.0, 1.0])
    assert rewards.logged["group_rm_logit/mean"] == sum(logits) / 2
    assert all(0.0 <= b <= 1.0 for b in balance) and all(-1.0 <= p <= 0.0 for p in penalty)


def test_group_scores_are_standardised_per_decision_point() -> None:
    scores = standardise_by_group({0: 10.0, 1: 30.0, 3: 7.0, 4: 7.0}, ["a", "a", "a", "b", "b", "b"], 6)
    assert scores[:3] == [-1.0, 1.0, EMPTY_BLOCK_REWARD]  # the empty block is scored, not None
    assert scores[3:] == [0.0, 0.0, EMPTY_BLOCK_REWARD]  # equal logits carry no preference
    # the scale does not depend on the reward model's: 1000x larger logits, same scores
    assert standardise_by_group({0: 1e4, 1: 3e4}, ["a", "a"], 2) == [-1.0, 1.0]
    spread = standardise_by_group({i: float(i == 0) * 100 for i in range(30)}, ["a"] * 30, 30)
    assert max(spread) == 2.0 and min(spread) < 0  # an outlier is clipped


def test_director_grpo_steps(tiny_model: Path, roster: Roster, episodes: list, tmp_path: Path) -> None:
    points = decision_points(episodes, roster)[:4]
    rollout, scorer = rollout_for(roster, block_turns=1), BlockScorer()
    config = DirectorTrainingConfig(lora_r=4, lora_alpha=8, block_turns=1, training={
        "max_steps": 2, "num_generations": 2, "per_device_train_batch_size": 4, "max_completion_length": 12,
        "learning_rate": 1e-2, "disable_tqdm": True})
    logs = Logs()
    report = train_director(points, base=str(tiny_model), out=tmp_path, rollout=rollout, group_rm=scorer,
                            config=config, callbacks=[logs])
    rollout.close()
    assert report.steps == 2 and len(report.rewards) == 2 and report.decision_points == 4
    assert report.reward_terms[3] == "direction_validity" and report.reward_weights[3] == 1.0
    assert len(scorer.calls) == 2 and all(len(blocks) == 4 for _, blocks in scorer.calls)
    card = json.loads((tmp_path / "director" / "adapter_card.json").read_text())
    assert (card["method"], card["data_size"], card["rewards"]) == ("grpo", 4, report.rewards)
    assert card["role"] == "director" and card["reward_terms"] == [
        "group_reward_model", "redundancy_penalty", "speaker_balance", "direction_validity", "round_fullness",
        "action_copy"]
    # the tiny random model writes no JSON: every direction was replaced and penalised
    validity = [e["rewards/direction_validity/mean"] for e in logs.entries if "rewards/direction_validity/mean" in e]
    assert validity == [-1.0, -1.0] and card["reward_weights"][3] == 1.0


def test_a_round_cut_short_or_a_copied_action_is_not_rewarded(roster: Roster, episodes: list) -> None:
    """What the hacked Director learned: hand back after one voice (redundancy 0, the best
    value) and fill the action with the prompt's words."""
    points = decision_points(episodes, roster)
    start = next(p for p in points if p.round_turns == 0)
    rollout = rollout_for(roster, block_turns=3)
    rewards = DirectorRewards(points, rollout, group_rm=None, embedder=LexicalEmbedder())
    first = roster.persona_ids[0]
    copied = f"The person said: {next(m['content'] for m in start.prompt if m['role'] == 'user')[:200]}"
    completions = [[{"role": "assistant", "content": json.dumps(d)}] for d in (
        {"speaker": first, "action": "ask what they want most from tonight", "tone": "warm"},
        {"speaker": first, "action": copied, "tone": "warm"})]
    ids = [start.context_id] * 2
    blocks = rewards.blocks(completions, ids)
    fullness = rewards.round_fullness([list(start.prompt)] * 2, completions, context_id=ids)
    copy = rewards.action_copy([list(start.prompt)] * 2, completions, context_id=ids)
    penalty = rewards.redundancy_penalty([list(start.prompt)] * 2, completions, context_id=ids)
    rollout.close()
    for block, full in zip(blocks, fullness, strict=True):
        voices = 0
        for turn in block.turns:
            if turn["role"] == "user":
                break
            voices += 1
        assert full == pytest.approx(min(1.0, voices / 3) - 1.0)
    assert all(p is None or -1.0 <= p <= 0.0 for p in penalty)
    assert copy == [0.0, -1.0]


def test_an_unscored_block_is_neutral_among_its_siblings() -> None:
    """TRL adds a None term as 0, the redundancy term's best value: a block with nobody to
    repeat would earn it. It gets its decision point's mean instead (no advantage)."""
    from mascot.training.fitting.director_rewards import neutral_where_unscored

    assert neutral_where_unscored([-0.6, None, -0.2, None, None], ["a", "a", "a", "b", "b"]) == [
        -0.6, pytest.approx(-0.4), -0.2, None, None]


def test_director_grpo_samples_on_the_server_and_rewards_the_blocks_it_played(
        tiny_model: Path, roster: Roster, episodes: list, tmp_path: Path) -> None:
    """``DirectorRollout`` against a stand-in for vLLM's chat completions: one request per
    distinct prompt with ``n`` samples and every sampling field, the adapter saved and loaded
    once per step, and the reward terms score the blocks the rollout played (none played twice)."""
    import httpx
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from mascot.training.fitting.director_rollout import ADAPTER_NAME, DirectorRollout

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    points = decision_points(episodes, roster)[:4]
    requests: list[dict] = []
    loads: list[tuple[str, Path]] = []

    def vllm(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        requests.append(body)
        prompt = tokenizer.apply_chat_template(body["messages"], add_generation_prompt=True, tokenize=False)
        choices = []
        for index in range(body["n"]):
            speaker = roster.persona_ids[(len(requests) + index) % len(roster.persona_ids)]
            text = json.dumps({"speaker": speaker, "action": "ask what went wrong", "tone": "calm"})
            ids = tokenizer(text, add_special_tokens=False)["input_ids"][: body["max_tokens"]]
            choices.append({"index": index, "message": {"role": "assistant", "content": text}, "token_ids": ids,
                            "logprobs": {"content": [{"logprob": -1.0} for _ in ids]}})
        return httpx.Response(200, json={"prompt_token_ids": tokenizer(prompt, add_special_tokens=False)["input_ids"],
                                         "choices": choices})

    rollout = rollout_for(roster, block_turns=1)
    played: list[int] = []
    run = rollout.run
    rollout.run = lambda pts, texts: played.append(len(pts)) or run(pts, texts)  # type: ignore[method-assign]
    server = DirectorRollout(points, rollout, url="http://vllm.test/v1", served_name="tiny",
                             adapters_dir=tmp_path / "served", client=httpx.Client(transport=httpx.MockTransport(vllm)),
                             load=lambda url, adapters: loads.extend((url, a.path) for a in adapters))
    scorer, logs = BlockScorer(), Logs()
    config = DirectorTrainingConfig(lora_r=4, lora_alpha=8, block_turns=1, training={
        "max_steps": 2, "num_generations": 2, "per_device_train_batch_size": 4, "max_completion_length": 24,
        "learning_rate": 1e-2, "top_k": 20, "disable_tqdm": True})
    report = train_director(points, base=str(tiny_model), out=tmp_path, rollout=rollout, group_rm=scorer,
                            config=config, callbacks=[logs], rollout_func=server)
    rollout.close()
    assert report.steps == 2 and played == [4, 4]  # each batch's blocks played once, by the rollout
    assert len(requests) == 4 and all(r["n"] == 2 and r["model"] == ADAPTER_NAME for r in requests)
    assert {k: requests[0][k] for k in ("max_tokens", "temperature", "top_k", "logprobs", "return_token_ids")} == {
        "max_tokens": 24, "temperature": 1.0, "top_k": 20, "logprobs": True, "return_token_ids": True}
    assert [p.name for _, p in loads] == ["step-0", "step-1"] and all(u == "http://vllm.test/v1" for u, _ in loads)
    assert sorted(p.name for p in (tmp_path / "served").iterdir()) == ["step-0", "step-1"]
    # the served directions are valid JSON naming a voice: no replaced direction was penalised
    validity = [e["rewards/direction_validity/mean"] for e in logs.entries if "rewards/direction_validity/mean" in e]
    assert validity and all(v > -1.0 for v in validity) and len(scorer.calls) == 2
    weights = load_file(str(tmp_path / "director" / "adapter_model.safetensors"))
    assert any(name.endswith("lora_B.weight") and float(w.abs().sum()) > 0 for name, w in weights.items())
