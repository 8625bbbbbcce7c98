"""Fitting: reward models, speakers (GRPO, DPO) and the Director (GRPO) as LoRA adapters; recipes and rewards."""
