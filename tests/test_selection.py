"""Learning by selection: ranking by measured outcomes, pairs from the samples' own groups,
directions played as blocks, DPO of the Director, and the pipeline's stages."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import yaml
from fakes import PromptChat
from safetensors.torch import load_file

from mascot.cli.pipeline_run import load_recipe, stages
from mascot.graphs.embeddings import LexicalEmbedder
from mascot.rosters import Roster
from mascot.training.data.selection import FAULTY, pool_pairs, score_samples, select_rows, selection_counts
from tests.test_policy_training_cli import ROSTER, mascot

LEXICAL = LexicalEmbedder()
PROMPT = [{"role": "system", "content": "You are the Anchor."}, {"role": "user", "content": "I failed my exam."}]
EARLIER = "Failing one exam says very little about you, and what matters is what you do next with it."


def _reply(context: str, sample: int, text: str, fault: str | None = None, source: str = "policy",
           persona: str = "anchor") -> dict:
    return {"source": source, "context_id": context, "sample": sample, "role": "speakers", "persona": persona,
            "prompt": PROMPT, "completion": text, "fault": fault, "voices": [EARLIER]}


def _direction(context: str, sample: int, reply: str | None, faults: tuple[str, ...] = ()) -> dict:
    direction = {"speaker": "anchor", "action": f"Acknowledge the hurt, version {sample}", "tone": "warm"}
    row = {"source": "teacher", "context_id": context, "sample": sample, "role": "director", "persona": "director",
           "prompt": PROMPT, "completion": json.dumps(direction), "fault": None}
    if reply is not None:
        row.update(block_speaker="anchor", block_reply=reply, block_voices=[EARLIER], block_faults=list(faults))
    return row


#: A reply of the Anchor's own (feelings, being heard) and one that says the voice before it again.
OWN = ("That sounds painful, and it makes sense you feel hurt and heard so little right now; I am here with "
       "you, steady and warm, and nothing needs fixing before you feel it.")
REPEAT = ("Failing one exam says very little about you, and what matters is what you do next with it, really, "
          "so think about what you do next.")


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_the_reply_of_its_own_ranks_above_the_repeat_and_faults_never_rank(roster: Roster, tmp_path: Path) -> None:
    rows = [_reply("c1", 0, REPEAT), _reply("c1", 1, OWN), _reply("c1", 2, "I'm sorry, but I can't.", "refusal")]
    scored = score_samples(rows, roster, embedder=LEXICAL)
    assert scored[2].score is None
    assert scored[1].score > scored[0].score
    kept = select_rows(_write(tmp_path / "s.jsonl", rows), roster, keep=1, embedder=LEXICAL)
    assert [r["completion"][0]["content"] for r in kept["speakers"]] == [OWN]
    two = select_rows(tmp_path / "s.jsonl", roster, keep=2, embedder=LEXICAL)
    assert [r["completion"][0]["content"] for r in two["speakers"]] == [OWN, REPEAT]  # best first
    # the reply that is too short for two to four sentences loses to the same reply at length
    short = score_samples([_reply("c2", 0, "That sounds painful.")], roster, embedder=LEXICAL)[0].score
    assert short < score_samples([_reply("c2", 0, OWN)], roster, embedder=LEXICAL)[0].score


def test_a_direction_is_ranked_by_what_its_voice_then_said(roster: Roster, tmp_path: Path) -> None:
    rows = [_direction("p1", 0, REPEAT), _direction("p1", 1, OWN), _direction("p1", 2, "Sorry, I can't.", ("refusal",)),
            _direction("p2", 0, None)]
    scored = score_samples(rows, roster, embedder=LEXICAL)
    assert scored[1].score > scored[0].score > FAULTY and scored[2].score == FAULTY
    assert scored[3].score == 0.0  # not played: nothing measured
    kept = select_rows(_write(tmp_path / "s.jsonl", rows), roster, keep=1, embedder=LEXICAL)
    assert [json.loads(r["completion"][0]["content"])["action"] for r in kept["director"]] == [
        "Acknowledge the hurt, version 1", "Acknowledge the hurt, version 0"]


def test_pool_pairs_take_the_best_against_a_faulty_sample_or_the_worst_by_margin(roster: Roster,
                                                                                 tmp_path: Path) -> None:
    rows = [_reply("c1", 0, REPEAT), _reply("c1", 1, OWN), _reply("c1", 2, "How can I assist you today?", "helpdesk"),
            _reply("c2", 0, REPEAT), _reply("c2", 1, OWN),  # no fault: the worst passing one, past the margin
            _reply("c3", 0, OWN), _reply("c3", 1, OWN + " Really."),  # too close: no pair
            _direction("p1", 0, REPEAT), _direction("p1", 1, OWN)]
    path = _write(tmp_path / "s.jsonl", rows)
    made = pool_pairs(path, roster, min_margin=0.05, embedder=LEXICAL)
    pairs = {p["context_id"]: p for split in made.values() for p in split}
    assert set(pairs) == {"c1", "c2", "p1"}
    assert pairs["c1"]["chosen"][0]["content"] == OWN
    assert pairs["c1"]["rejected"][0]["content"] == "How can I assist you today?"
    assert pairs["c1"]["provenance"]["rejected"]["why"] == "fault: helpdesk"
    assert pairs["c1"]["rejected_overall"] == FAULTY and pairs["c1"]["margin"] == pairs["c1"]["chosen_overall"] - FAULTY
    assert pairs["c2"]["rejected"][0]["content"] == REPEAT and pairs["c2"]["margin"] >= 0.05
    assert pairs["p1"]["persona"] == "director"
    assert pool_pairs(path, roster, min_margin=5.0, embedder=LEXICAL)["train"] == [pairs["c1"]] or \
        pool_pairs(path, roster, min_margin=5.0, embedder=LEXICAL)["test"] == [pairs["c1"]]
    counts = selection_counts(path, roster, keep=1, embedder=LEXICAL)
    assert counts["policy/speakers"] == {"sampled": 7, "passed": 6, "kept": 3, "helpdesk": 1}
    assert counts["teacher/director"] == {"sampled": 2, "passed": 2, "kept": 1}


def test_samples_play_each_passing_direction_as_a_one_turn_block(roster: Roster, episodes: list,
                                                                  tmp_path: Path) -> None:
    from mascot.training.data.block_rollout import decision_points
    from mascot.training.data.warm_start_samples import sample_warm_start

    good = PromptChat(reply=lambda p: json.dumps({"speaker": "catalyst", "action": "Ask which part of it weighs most",
                                                  "tone": "calm"}) if "Reply with one JSON object" in p
                      else "Which part of it weighs on you most, when you picture tomorrow morning?")
    heard = []
    voice = PromptChat(reply=lambda p: heard.append(p) or "How can I assist you today?")
    points = [p for p in decision_points(episodes, roster) if p.round_turns == 0][:2]
    asyncio.run(sample_warm_start(points, [], roster,
                                  {"policy": dict.fromkeys(["director", *roster.persona_ids], good)},
                                  k=1, out=tmp_path / "s.jsonl", play=dict.fromkeys(roster.persona_ids, voice)))
    rows = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    played = [r for r in rows if r["fault"] is None]
    assert played, [r["fault"] for r in rows]
    assert len(heard) == len(played)
    assert all(r["block_speaker"] == "catalyst" and r["block_faults"] == ["helpdesk"] for r in played)
    assert "Ask which part of it weighs most" in heard[0]  # the voice was given the sampled direction
    assert all(s.score == FAULTY for s in score_samples(played, roster, embedder=LEXICAL))


def test_pairs_from_samples_then_dpo_of_the_director_with_an_sft_term(tiny_model: Path, roster: Roster,
                                                                      tmp_path: Path) -> None:
    rows = [_direction(f"p{i}", s, OWN if s else REPEAT) for i in range(3) for s in range(2)]
    rows += [r for i in range(3)
             for r in (_reply(f"c{i}", 0, OWN), _reply(f"c{i}", 1, "Sorry, I cannot help.", "refusal"))]
    path = _write(tmp_path / "samples.jsonl", rows)
    result = mascot("pairs", "--samples", str(path), *ROSTER, "--min-margin", "0", "--out", str(tmp_path / "pairs"))
    assert "director 3, speakers 3; 3 against a faulty sample" in result.stdout
    recipe = tmp_path / "dpo.yaml"
    recipe.write_text(yaml.safe_dump({"loss_type": ["sigmoid", "sft"], "loss_weights": [1.0, 1.0], "max_steps": 2,
                                      "learning_rate": 0.05, "per_device_train_batch_size": 2, "max_length": 256,
                                      "lora_r": 4, "save_steps": 1}))
    result = mascot("train-director", *ROSTER, "--method", "dpo", "--base", str(tiny_model), "--pairs",
                    str(tmp_path / "pairs"), "--config", str(recipe), "--out", str(tmp_path / "adapters"),
                    "--disable_tqdm", "true")
    assert "train-director: director ->" in result.stdout and "(dpo, 2 steps" in result.stdout
    weights = load_file(tmp_path / "adapters" / "director" / "adapter_model.safetensors")
    assert any(float(t.abs().sum()) > 0 for name, t in weights.items() if "lora_B" in name)  # B starts at zero
    assert yaml.safe_load((tmp_path / "adapters" / "policies.yaml").read_text())["roles"]["director"]["adapter"]
    refused = mascot("train-director", *ROSTER, "--method", "dpo", "--base", str(tiny_model), "--out",
                     str(tmp_path / "x"), ok=False)
    assert refused.returncode == 2 and "--method dpo needs --pairs" in refused.stderr.strip().splitlines()[-1]
    speakers_only = tmp_path / "speakers-only.jsonl"
    speakers_only.write_text("".join(line + "\n"
                                     for line in (tmp_path / "pairs" / "train.jsonl").read_text().splitlines()
                                     if json.loads(line)["persona"] != "director"))
    skipped = mascot("train-director", *ROSTER, "--method", "dpo", "--base", str(tiny_model), "--pairs",
                     str(speakers_only), "--init_adapter", str(tmp_path / "adapters" / "director"), "--out",
                     str(tmp_path / "kept"))
    assert "no Director pairs" in skipped.stderr and "is kept as the Director's adapter" in skipped.stderr
    kept = yaml.safe_load((tmp_path / "kept" / "policies.yaml").read_text())["roles"]["director"]
    assert Path(kept["model"]) == tiny_model and "director" in str(kept["adapter"])
    missing = mascot("pairs", "--samples", str(tmp_path / "none.jsonl"), *ROSTER, "--out", str(tmp_path / "p"),
                     ok=False)
    assert "--samples: no such file" in missing.stderr


def test_a_recipe_with_selection_iterates_then_pairs_then_dpo(tmp_path: Path) -> None:
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump({
        "roster": "emotional_support", "model": "Qwen/Qwen3-0.6B", "out": "run", "engine": "vllm",
        "rollout": {"episodes": 2}, "judge": {"model": "Qwen/Qwen3-0.6B"},
        "selection": {"iterations": 2, "k": 6, "teacher": "Qwen/Qwen3-1.7B", "sft": "sft.yaml", "dpo": "dpo.yaml"},
        "eval": {"episodes": 2, "baselines": ["untrained_director"]}}))
    plan = dict(stages(load_recipe(tmp_path / "recipe.yaml"), tmp_path))
    assert list(plan) == ["rollout", "select-0-samples", "select-0-sft", "select-1-samples", "select-1-sft",
                          "select-pairs", "select-dpo-speakers", "select-dpo-director", "eval"]
    run = tmp_path / "run"
    second = plan["select-1-samples"]
    assert second[second.index("--policies") + 1] == str(run / "select" / "0" / "policies.yaml")  # the policy so far
    assert second[second.index("--teacher-model") + 1] == "Qwen/Qwen3-1.7B" and "--play" in second
    assert plan["select-0-sft"][plan["select-0-sft"].index("--config") + 1] == str(tmp_path / "sft.yaml")
    assert plan["select-dpo-director"][plan["select-dpo-director"].index("--init_adapter") + 1] == str(
        run / "select" / "1" / "director")
    evaluate = plan["eval"]
    assert evaluate[evaluate.index("--policies") + 1] == str(run / "adapters" / "policies.yaml")
    assert evaluate[evaluate.index("--sft") + 1] == str(run / "select" / "1" / "policies.yaml")
    assert not any(name.startswith(("judge", "persona-rm", "speakers", "director")) for name in plan)


def test_selection_never_learns_a_guarded_turn_or_an_agreement_with_despair(roster: Roster) -> None:
    """What the 1.5B teacher wrote to a person saying they were a burden passed every check of
    style; selection must not keep it, nor any turn a safety rule governs."""
    despair = "It sounds like you're very tired. You're right that everyone would benefit from less of you around."
    guarded = _reply("c1", 1, OWN)
    guarded["prompt"] = [{"role": "system", "content": "You are the Anchor.\n\nSafety comes first now: the person "
                                                       "may be in danger."}, PROMPT[1]]
    rows = [_reply("c1", 0, despair), guarded, _reply("c2", 0, OWN)]
    scored = score_samples(rows, roster, embedder=LEXICAL)
    assert [s.score is None for s in scored] == [True, True, False]
    assert not any(s.passed for s in scored[:2])
    played = _direction("p1", 0, despair)
    assert score_samples([played], roster, embedder=LEXICAL)[0].score is None
