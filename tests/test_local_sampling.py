"""Per-row sampling of the local backend: own settings, own random stream, model defaults."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import GenerationConfig

from mascot.policies.local import LocalBackend
from mascot.policies.local.sampling import RowSampler, Sampling, row_seeds, sampling_for

CONVERSATION = [{"role": "user", "content": "Tell me one thing to try tonight"}]


def drawn(sampler: RowSampler, input_ids: torch.Tensor, scores: torch.Tensor) -> list[int]:
    picked = sampler(input_ids, scores.clone())
    assert torch.isinf(picked).sum(1).tolist() == [scores.shape[1] - 1] * scores.shape[0]  # one-hot rows
    return picked.argmax(1).tolist()


def test_each_row_draws_from_its_own_stream_whatever_shares_the_batch() -> None:
    scores = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    ids = torch.zeros(4, 3, dtype=torch.long)
    hot = Sampling(temperature=2.0)
    alone = [drawn(RowSampler([hot], [seed], [0], "cpu"), ids[:1], scores[i : i + 1])[0]
             for i, seed in enumerate([11, 12, 13, 14])]
    together = drawn(RowSampler([hot] * 4, [11, 12, 13, 14], [0] * 4, "cpu"), ids, scores)
    assert together == alone
    # and across steps: the second draw of a row is also the same alone or in company
    solo, group = RowSampler([hot], [13], [0], "cpu"), RowSampler([hot] * 4, [11, 12, 13, 14], [0] * 4, "cpu")
    steps = [(drawn(solo, ids[:1], scores[2:3])[0], drawn(group, ids, scores)[2]) for _ in range(5)]
    assert all(a == b for a, b in steps) and len({a for a, _ in steps}) > 1


def test_greedy_top_k_one_and_top_p_tiny_pick_the_likeliest() -> None:
    scores = torch.randn(3, 40, generator=torch.Generator().manual_seed(1))
    settings = [Sampling(temperature=0), Sampling(temperature=5.0, top_k=1), Sampling(temperature=5.0, top_p=1e-6)]
    assert drawn(RowSampler(settings, [0, 1, 2], [0, 0, 0], "cpu"), torch.zeros(3, 1, dtype=torch.long),
                 scores) == scores.argmax(1).tolist()


def test_top_k_and_top_p_keep_draws_inside_their_sets() -> None:
    scores = torch.linspace(0, 8, 30).repeat(2, 1)  # token 29 likeliest, then 28, ...
    sampler = RowSampler([Sampling(temperature=1.0, top_k=3), Sampling(temperature=1.0, top_p=0.4)], [3, 4], [0, 0],
                         "cpu")
    picks = [drawn(sampler, torch.zeros(2, 1, dtype=torch.long), scores) for _ in range(50)]
    assert {row[0] for row in picks} <= {27, 28, 29} and len({row[0] for row in picks}) > 1
    # the likeliest token holds 0.24 of the mass, the two likeliest 0.42: top_p 0.4 keeps two
    assert {row[1] for row in picks} == {28, 29}


def test_draws_follow_the_distribution() -> None:
    scores = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    for setting, expected in ((Sampling(), [0.5, 0.3, 0.15, 0.05]), (Sampling(top_p=0.7), [0.625, 0.375, 0, 0]),
                              (Sampling(temperature=0.5, top_k=2), [0.735, 0.265, 0, 0])):
        sampler = RowSampler([setting], [42], [0], "cpu")
        picks = [drawn(sampler, torch.zeros(1, 1, dtype=torch.long), scores)[0] for _ in range(4000)]
        frequencies = [picks.count(token) / len(picks) for token in range(4)]
        assert all(abs(f - e) < 0.03 for f, e in zip(frequencies, expected, strict=True)), (setting, frequencies)


def test_repetition_penalty_ignores_left_padding() -> None:
    scores = torch.tensor([[2.0, 1.9, 0.0, -1.0]] * 2)
    penalty = Sampling(temperature=0, repetition_penalty=1.2)
    # row 0: token 0 is only padding (before the prompt start), so it is not penalised
    ids = torch.tensor([[0, 0, 3], [0, 0, 0]])
    assert drawn(RowSampler([penalty] * 2, [0, 0], [2, 0], "cpu"), ids, scores) == [0, 1]


def test_settings_come_from_the_caller_then_the_generation_config() -> None:
    qwen = GenerationConfig(do_sample=True, temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05)
    assert sampling_for(qwen) == Sampling(temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05)
    assert sampling_for(qwen, temperature=0.3, top_p=0.9) == Sampling(0.3, 0.9, 20, 1.05)
    assert sampling_for(qwen, top_k=0, repetition_penalty=1.0) == Sampling(0.7, 0.8, 0, 1.0)
    assert sampling_for(GenerationConfig()) == Sampling(temperature=1.0, top_p=1.0, top_k=0, repetition_penalty=1.0)
    with pytest.raises(ValueError, match="top_p must be in"):
        sampling_for(qwen, top_p=0)
    with pytest.raises(ValueError, match="temperature must be 0"):
        Sampling(temperature=-1)
    assert row_seeds(7, 3) == [7, 8, 9] and row_seeds(2**64 - 1, 2) == [2**64 - 1, 0]
    assert row_seeds(None, 2) != row_seeds(None, 2)


def test_the_models_generation_config_top_k_applies_unless_overridden(tiny_model: Path) -> None:
    backend = LocalBackend.load(str(tiny_model))
    greedy = backend.generate([CONVERSATION], temperature=0, max_new_tokens=10)[0].text
    backend.model.generation_config.top_k = 1  # as if the model shipped top_k=1: sampling is greedy
    assert backend.generate([CONVERSATION], temperature=1.5, seed=3, max_new_tokens=10)[0].text == greedy
    assert backend.generate([CONVERSATION], temperature=1.5, top_k=0, seed=3, max_new_tokens=10)[0].text != greedy
