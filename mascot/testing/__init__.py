"""Stand-ins for tests, the demo and dry runs, kept apart from the product's runtime.

- ``stub_server``: an OpenAI-compatible stub server whose judge scores by hash.
- ``tiny_model``: a tiny random-weight model and tokenizer built offline in seconds.
"""
