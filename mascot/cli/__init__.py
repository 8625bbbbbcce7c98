"""The ``mascot`` command line; each command lives in the module named after it.

- ``rosters``: rosters, rosters show/check/new/schema
- ``chat``: graph, chat
- ``episodes``: rollout, import-logs
- ``judging``: judge
- ``data``: candidates, blocks, pairs
- ``fitting``: train-rm, train-sft, train-speakers, train-director
- ``evaluation``: eval, show
- ``serve``: serve
- ``pipeline``: pipeline, demo
- ``offline_model``: offline-model
- ``offline_encoder``: offline-encoder
- ``tiny_model``: tiny-model
- ``options``: flags and console output shared by the commands
- ``pipeline_recipe``: the pipeline recipe file and its validation
- ``pipeline_run``: the pipeline's resumable run, one ``mascot`` child per stage
- ``rollout_workers``: a rollout as several ``mascot rollout`` shard processes
- ``child``: the one place that builds a ``mascot`` child process's command line
- ``training_inputs``: the files the training commands read, checked flag by flag
"""

from mascot.cli.main import main

__all__ = ["main"]
