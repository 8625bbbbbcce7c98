"""mascot: direct ensembles of LLM personas with a trained Director."""
