"""Training pipeline: rollouts, judging, preference pairs, reward models, GRPO/DPO, evaluation."""

__all__: list[str] = []
