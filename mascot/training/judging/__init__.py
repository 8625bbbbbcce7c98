"""Judging: rubrics, the rubric LLM judge and its cache, judge sanity sets, metric judges, judge targets."""
