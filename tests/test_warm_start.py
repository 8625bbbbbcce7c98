"""The SFT warm start: which rows it learns from, ``mascot train-sft`` on the tiny model, and
GRPO going on from its adapter (``--init_adapter``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from mascot.training.data.candidates import Candidate
from mascot.training.data.pairs import build_pairs, write_pairs
from mascot.training.data.sibling_blocks import BlockCandidate, read_block_candidates
from mascot.training.fitting.warm_start import WarmStartError, director_rows, speaker_rows
from mascot.training.judging.judgement import JudgedCandidate
from tests.test_policy_training_cli import ROSTER, _candidate_rows, mascot


def _pair(context: str, chosen: str, overall: float, persona: str = "anchor", sample: int = 0) -> dict:
    prompt = [{"role": "system", "content": "You are Anchor."}, {"role": "user", "content": "I failed my exam."}]
    return {"prompt": prompt, "chosen": [{"role": "assistant", "content": chosen}],
            "rejected": [{"role": "assistant", "content": "ok"}], "margin": 1.0, "context_id": context,
            "persona": persona, "chosen_overall": overall, "rejected_overall": 10.0,
            "provenance": {"chosen": {"sample": sample}, "rejected": {"sample": 9}}}


def test_speaker_rows_take_each_contexts_best_winner_and_drop_faults() -> None:
    found = speaker_rows([
        _pair("a", "That sounds heavy. What part of it stays with you most?", 60.0),
        _pair("a", "Failing one exam says little about you. What did you expect of it?", 80.0),
        _pair("b", "I'm sorry, but I can't assist with that.", 90.0),
        _pair("c", "Which subject was it, and what happens next?", 70.0),
    ])
    assert found.contexts == 3
    assert [r["completion"][0]["content"] for r in found.rows] == [
        "Failing one exam says little about you. What did you expect of it?",
        "Which subject was it, and what happens next?"]
    assert found.faults == {"refusal": 1}
    assert found.rows[0]["prompt"][-1] == {"role": "user", "content": "I failed my exam."}


def _block(context: str, sample: int, speaker: str, validity: str = "valid") -> BlockCandidate:
    return BlockCandidate(context_id=context, episode_id="e", cut=1, sample=sample,
                          prompt=[{"role": "user", "content": "I failed my exam."}],
                          turns=[{"role": "assistant", "content": "...", "name": speaker}],
                          direction={"speaker": speaker, "action": f"{speaker} asks what the exam meant",
                                     "tone": "warm", "addressee": None, "offered": ["beacon", speaker, "user"]},
                          validity=validity)


def test_director_rows_learn_the_best_blocks_direction_as_the_models_json() -> None:
    blocks = [_block("p1", 0, "anchor"), _block("p1", 1, "catalyst"), _block("p2", 0, "beacon", "replaced")]
    prompts = {"p1": [{"role": "system", "content": "Direct."}, {"role": "user", "content": "who next?"}],
               "p2": [{"role": "system", "content": "Direct."}]}
    found = director_rows([_pair("p1", "x", 60.0, "group", 0), _pair("p1", "y", 75.0, "group", 1),
                           _pair("p2", "z", 90.0, "group", 0)], blocks, prompts)
    assert found.contexts == 2 and found.invalid == 1 and len(found.rows) == 1
    row = found.rows[0]
    assert row["prompt"] == prompts["p1"]
    # what the model writes: no None fields, nothing mascot adds (offered)
    assert json.loads(row["completion"][0]["content"]) == {"speaker": "catalyst", "action": "catalyst asks what the "
                                                           "exam meant", "tone": "warm"}
    with pytest.raises(WarmStartError, match="not in the blocks"):
        director_rows([_pair("p3", "x", 60.0, "group", 0)], blocks, prompts)
    with pytest.raises(WarmStartError, match="not in the episodes"):
        director_rows([_pair("p1", "x", 60.0, "group", 0)], blocks, {})


@pytest.fixture(scope="module")
def sft_data(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny-model episodes and sibling blocks; persona pairs with a learnable winner, and
    group pairs that prefer the blocks of sample 1."""
    root = tmp_path_factory.mktemp("warm-start")
    policies = str(tiny_model / "policies.yaml")
    mascot("rollout", *ROSTER, "--policies", policies, "--max-tokens", "8", "--episodes", "2", "--max-rounds", "1",
           "--out", str(root / "episodes.jsonl"))
    mascot("blocks", "--in", str(root / "episodes.jsonl"), *ROSTER, "--policies", policies, "--g", "2",
           "--block-turns", "1", "--max-points", "3", "--max-tokens", "6", "--out", str(root / "blocks.jsonl"))
    # the tiny model's own directions are replaced by the fallback; make them the model's
    blocks = [b.model_copy(update={"validity": "valid"}) for b in read_block_candidates(root / "blocks.jsonl")]
    (root / "blocks.jsonl").write_text("".join(b.model_dump_json() + "\n" for b in blocks))
    judged = [JudgedCandidate(context_id=b.context_id, prompt=b.prompt, persona="group", reply=b.reply,
                              overall=80.0 if b.sample == 1 else 20.0, judgement={"sample": b.sample})
              for b in blocks]
    write_pairs(build_pairs(judged, test_fraction=0.0), root / "group-pairs")
    judged = [JudgedCandidate(context_id=c.context_id, prompt=c.prompt, persona=c.persona, reply=reply,
                              overall=overall)
              for c in (Candidate(**row) for row in _candidate_rows(root / "episodes.jsonl"))
              for reply, overall in (("What would help most tonight?", 90.0), ("fine", 10.0))]
    write_pairs(build_pairs(judged, test_fraction=0.0), root / "pairs")
    return root


def test_train_sft_fits_both_adapters_and_grpo_goes_on_from_one(tiny_model: Path, sft_data: Path) -> None:
    out = sft_data / "sft"
    result = mascot("train-sft", *ROSTER, "--base", str(tiny_model), "--pairs", str(sft_data / "pairs"),
                    "--group-pairs", str(sft_data / "group-pairs"), "--blocks", str(sft_data / "blocks.jsonl"),
                    "--episodes", str(sft_data / "episodes.jsonl"), "--out", str(out), "--lora_r", "4",
                    "--num_train_epochs", "6", "--learning_rate", "5e-3", "--per_device_train_batch_size", "2")
    assert "speakers ->" in result.stdout and "director ->" in result.stdout, result.stdout
    for name in ("speakers", "director"):
        card = json.loads((out / name / "adapter_card.json").read_text())
        assert card["method"] == "sft" and card["data_size"] >= 1 and card["steps"] >= 2
        # the learnable rows get learnt: token accuracy of the completions rises
        assert card["reward_last"] > card["reward_first"], card["rewards"]
        weights = load_file(out / name / "adapter_model.safetensors")
        assert any(k.endswith("lora_B.weight") and v.abs().sum() > 0 for k, v in weights.items())  # moved from 0
    roles = yaml.safe_load((out / "policies.yaml").read_text())["roles"]
    assert roles["director"]["adapter"].endswith("director") and roles["anchor"]["adapter"].endswith("speakers")

    # the candidate sampler: candidates sampled by the warm start's policy file
    mascot("candidates", "--in", str(sft_data / "episodes.jsonl"), *ROSTER, "--policies", str(out / "policies.yaml"),
           "--k", "2", "--max-tokens", "6", "--out", str(sft_data / "sft-candidates.jsonl"))
    rows = [json.loads(line) for line in (sft_data / "sft-candidates.jsonl").read_text().splitlines()]
    assert rows and all(r["policy"]["adapter"] == "speakers" for r in rows), rows[0].get("policy")

    grpo = mascot("train-speakers", *ROSTER, "--base", str(tiny_model), "--episodes",
                  str(sft_data / "episodes.jsonl"), "--shared", "--out", str(sft_data / "adapters"),
                  "--config", "speakers-cpu-smoke", "--max_steps", "1", "--rm_weight", "0",
                  "--init_adapter", str(out / "speakers"))
    assert "speakers ->" in grpo.stdout
    card = json.loads((sft_data / "adapters" / "speakers" / "adapter_card.json").read_text())
    assert card["init_adapter"] == str(out / "speakers")
    start = load_file(out / "speakers" / "adapter_model.safetensors")
    after = load_file(sft_data / "adapters" / "speakers" / "adapter_model.safetensors")
    assert start.keys() == after.keys()  # the same adapter, gone on training (its rank, its modules)


@pytest.mark.parametrize(("args", "message"), [
    ([], "give --samples"),
    (["--samples", "s.jsonl", "--pairs", "p"], "either --samples or --pairs"),
    (["--samples", "nowhere.jsonl"], "--samples: no such file"),
    (["--group-pairs", "x"], "needs --blocks FILE and --episodes FILE"),
    (["--pairs", "nowhere"], "--pairs: no such file"),
])
def test_train_sft_usage_errors(args: list[str], message: str, tmp_path: Path) -> None:
    result = mascot("train-sft", *ROSTER, "--out", str(tmp_path / "sft"), *args, ok=False)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


def test_eval_runs_the_warm_start_as_the_sft_system_under_the_same_budgets(tiny_model: Path, sft_data: Path) -> None:
    sft = sft_data / "sft" / "policies.yaml"
    if not sft.is_file():  # the warm start of the test above, smaller when this test runs alone
        mascot("train-sft", *ROSTER, "--base", str(tiny_model), "--pairs", str(sft_data / "pairs"), "--out",
               str(sft_data / "sft"), "--lora_r", "4", "--max_steps", "1")
    out = sft_data / "eval"
    result = mascot("eval", *ROSTER, "--policies", str(tiny_model / "policies.yaml"), "--sft", str(sft),
                    "--baselines", "untrained_director", "--episodes", "1", "--max-rounds", "2",
                    "--max-tokens", "speakers=6,director=40,user=7", "--rubrics", "persona",
                    "--metrics-only", "trained,sft,untrained_director", "--judge-model", str(tiny_model),
                    "--out", str(out))
    assert (out / "episodes" / "sft.jsonl").is_file(), result.stderr[-2000:]
    sft_turns = [m for line in (out / "episodes" / "sft.jsonl").read_text().splitlines()
                 for m in json.loads(line)["messages"] if m.get("name") == "anchor" or m.get("name") == "beacon"]
    assert all(m["policy"]["adapter"] == "speakers" for m in sft_turns if m.get("policy"))
    setup = json.loads((out / "results.json").read_text())["setup"]
    assert setup["systems"][:2] == ["trained", "sft"]
    assert setup["reply_budgets"]["anchor"] == 6 and setup["reply_budgets"]["user"] == 7
    assert setup["max_rounds"] == 2
    # the baseline on the bare base writes under the same budgets: no reply longer than 6 tokens
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model / "qwen3") if (tiny_model / "qwen3").is_dir() else None
    if tokenizer is not None:
        for line in (out / "episodes" / "untrained_director.jsonl").read_text().splitlines():
            for m in json.loads(line)["messages"]:
                if m["role"] == "assistant" and m.get("name") in ("anchor", "catalyst", "beacon", "action_guide"):
                    assert len(tokenizer(m["content"])["input_ids"]) <= 8, m["content"]


def test_samples_then_train_sft_on_the_ones_that_passed(tiny_model: Path, sft_data: Path, roster,
                                                        tmp_path: Path) -> None:
    import asyncio

    from fakes import PromptChat

    from mascot.training.data.block_rollout import decision_points
    from mascot.training.data.candidates import candidate_contexts
    from mascot.training.data.warm_start_samples import direction_fault, sample_warm_start
    from mascot.training.episodes.episode import read_episodes

    # the command on the tiny model: it runs, and a random model's directions do not pass
    result = mascot("samples", "--in", str(sft_data / "episodes.jsonl"), *ROSTER, "--policies",
                    str(tiny_model / "policies.yaml"), "--k", "1", "--max-points", "2", "--max-contexts", "2",
                    "--max-tokens", "8", "--out", str(tmp_path / "tiny.jsonl"))
    assert "samples: policy/director: 0 of 2 passed (left out: invalid 2)" in result.stdout
    assert len((tmp_path / "tiny.jsonl").read_text().splitlines()) == 4
    # a model whose directions and replies pass, and one that refuses: only the first is learned
    episodes = read_episodes(sft_data / "episodes.jsonl")
    good = PromptChat(reply=lambda p: json.dumps({"speaker": "catalyst", "action": "Ask which part of it weighs most",
                                                  "tone": "calm"}) if "Reply with one JSON object" in p
                      else "That sounds heavy, and it makes sense you are tired of it.")
    bad = PromptChat(reply=lambda p: "I'm sorry, but I can't help with that.")
    asyncio.run(sample_warm_start(decision_points(episodes, roster)[:3], candidate_contexts(episodes, roster)[:3],
                                  roster, {"policy": dict.fromkeys(["director", *roster.persona_ids], bad),
                                           "teacher": dict.fromkeys(["director", *roster.persona_ids], good)},
                                  k=2, out=tmp_path / "samples.jsonl"))
    result = mascot("train-sft", *ROSTER, "--base", str(tiny_model), "--samples", str(tmp_path / "samples.jsonl"),
                    "--out", str(tmp_path / "sft"), "--max_steps", "2", "--disable_tqdm", "true")
    passing = sum(direction_fault(good.reply("Reply with one JSON object"), p, roster) is None
                  for p in decision_points(episodes, roster)[:3])  # catalyst may have spoken at a point
    assert passing >= 1 and f"director: SFT on {passing} passing samples of {passing} contexts" in result.stderr
    assert "speakers: SFT on 3 passing samples of 3 contexts" in result.stderr  # distinct: one per context
    assert " invalid" in result.stderr and "6 refusal" in result.stderr  # the refusals of both roles
    for name in ("speakers", "director"):
        card = json.loads((tmp_path / "sft" / name / "adapter_card.json").read_text())
        assert card["data"] == str(tmp_path / "samples.jsonl") and card["steps"] == 2
    policy = yaml.safe_load((tmp_path / "sft" / "policies.yaml").read_text())
    assert {"director", *roster.persona_ids} <= set(policy["roles"])
