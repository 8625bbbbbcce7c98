"""JSON-schema grammars for the local backend: decoding that can only write valid JSON.

xgrammar (the structured-output engine vLLM uses) compiles a JSON schema against the
tokenizer once (~2 s for a 150k-token vocabulary), then masks, token by token, every
token the schema does not allow next. ``GrammarCache`` compiles each schema once per
backend; a ``GrammarProcessor`` (stateful, one per ``generate`` call) masks the rows that
carry a grammar and leaves the others alone, so constrained and free rows share a batch.
xgrammar is optional (the ``train`` extra): it is imported on first use.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

import torch
from transformers import LogitsProcessor

#: The schema of ``response_format={"type": "json_object"}``: any JSON object.
JSON_OBJECT: dict[str, Any] = {"type": "object"}
#: A string character as xgrammar writes it for a length-bounded string, and as strict JSON
#: allows it (no control character)
_LOOSE_STRING_CHARACTERS = '[^\\"\\\\\\r\\n]'
_STRICT_STRING_CHARACTERS = '[^\\0-\\x1f\\"\\\\\\r\\n]'
_XGRAMMAR_LOCATION = re.compile(r"^\[[\d:]+\] \S+:\d+: (Check failed: .*? is false: )?")


class GrammarError(ValueError):
    """A JSON schema that cannot be compiled into a grammar; the message says why."""


def xgrammar_module() -> ModuleType:
    """The ``xgrammar`` module.

    Raises:
        ImportError: if it is not installed, naming the package to install.
    """
    try:
        import xgrammar
    except ImportError:
        raise ImportError(
            "structured output on the local backend needs xgrammar: "
            "pip install 'mascot[train]' (or pip install xgrammar)"
        ) from None
    return xgrammar


def schema_key(schema: Mapping[str, Any]) -> str:
    """The canonical JSON of ``schema`` (no spaces), the key it is compiled and cached by.

    Keys keep their order: the order of ``properties`` is the order the model writes
    them in (a Director should name the ``speaker`` before the ``action``). An ``enum`` of
    strings is sorted: its order does not change what it accepts, and a Director offered
    its voices in a shuffled order would otherwise compile one grammar per order.

    Raises:
        GrammarError: if the schema is not JSON-serialisable.
    """
    try:
        return json.dumps(_sorted_enums(schema), separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise GrammarError(f"the JSON schema is not JSON: {exc}") from None


def _sorted_enums(value: Any) -> Any:
    """``value`` with every ``enum`` list of strings sorted (the rest as it is)."""
    if isinstance(value, Mapping):
        return {key: sorted(item) if key == "enum" and isinstance(item, list) and all(isinstance(v, str) for v in item)
                else _sorted_enums(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_sorted_enums(item) for item in value]
    return value


class GrammarCache:
    """Compiled grammars of one tokenizer, each schema compiled once.

    Args:
        tokenizer: The model's Hugging Face tokenizer.
        vocab_size: The model's vocabulary size (``model.config.vocab_size``; it can be
            larger than the tokenizer's because of padding rows).
        stop_token_ids: The tokens that end a generation (the model's EOS ids), which a
            grammar allows once its JSON is complete.
        max_schemas: Most schemas kept; the least recently used is dropped beyond it, so
            a server's clients cannot grow it without bound.
    """

    def __init__(
        self, tokenizer: Any, *, vocab_size: int, stop_token_ids: Sequence[int], max_schemas: int = 64
    ) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = list(stop_token_ids)
        self.max_schemas = max_schemas
        self._compiler: Any = None
        self._compiled: OrderedDict[str, Any] = OrderedDict()
        # one compile at a time: two threads asking for the same new schema compile it once
        self._lock = threading.Lock()

    def compile(self, schema: Mapping[str, Any]) -> Any:
        """The compiled grammar of ``schema`` (from the cache after the first call).

        JSON is written compactly (no free whitespace): with free whitespace small models
        can spend their whole token budget on newlines.

        Args:
            schema: A JSON schema (``JSON_OBJECT`` for any object).

        Returns:
            An ``xgrammar.CompiledGrammar``.

        Raises:
            ImportError: if xgrammar is not installed.
            GrammarError: if xgrammar cannot compile the schema.
        """
        key = schema_key(schema)
        with self._lock:
            if key in self._compiled:
                self._compiled.move_to_end(key)
                return self._compiled[key]
            if self._compiler is None:
                xgr = xgrammar_module()
                info = xgr.TokenizerInfo.from_huggingface(
                    self.tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.stop_token_ids
                )
                self._compiler = xgr.GrammarCompiler(info)
            try:
                compiled = self._compiler.compile_grammar(_json_grammar(key))
            except RuntimeError as exc:  # xgrammar's C++ errors arrive as RuntimeError
                reason = _XGRAMMAR_LOCATION.sub("", str(exc).strip().splitlines()[0])
                raise GrammarError(f"unsupported JSON schema: {reason}") from None
            self._compiled[key] = compiled
            if len(self._compiled) > self.max_schemas:
                self._compiled.popitem(last=False)
            return compiled


def _json_grammar(key: str) -> Any:
    """The xgrammar grammar of the JSON schema ``key``, with strict JSON strings.

    xgrammar (0.2.8) writes the characters of a string with ``minLength``/``maxLength`` as
    a class that lets raw control characters through (a sampled vertical tab made a reply
    ``json.loads`` rejects); that class is narrowed here to the one its other strings use.
    """
    xgr = xgrammar_module()
    grammar = xgr.Grammar.from_json_schema(key, any_whitespace=False, strict_mode=True)
    ebnf = str(grammar)
    if _LOOSE_STRING_CHARACTERS not in ebnf:
        return grammar
    return xgr.Grammar.from_ebnf(ebnf.replace(_LOOSE_STRING_CHARACTERS, _STRICT_STRING_CHARACTERS))


class GrammarProcessor(LogitsProcessor):
    """Masks the scores of each constrained row to the tokens its grammar allows next.

    Like ``xgrammar.contrib.hf.LogitsProcessor`` (one matcher per row, state advanced by
    the token the row just got), but rows without a grammar pass through unmasked, so
    requests with and without (or with different) grammars share one batch. Put it
    before the sampler. Stateful: one per ``generate`` call.

    Args:
        grammars: A compiled grammar or ``None`` per row; at least one grammar.

    Raises:
        ValueError: if no row has a grammar.
    """

    def __init__(self, grammars: Sequence[Any]) -> None:
        constrained = [grammar for grammar in grammars if grammar is not None]
        if not constrained:
            raise ValueError("a GrammarProcessor needs at least one row with a grammar")
        self._xgr = xgrammar_module()
        self.matchers = {row: self._xgr.GrammarMatcher(g) for row, g in enumerate(grammars) if g is not None}
        self.bitmask = self._xgr.allocate_token_bitmask(len(grammars), constrained[0].tokenizer_info.vocab_size)
        self._started = False

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        """Advance each live matcher by its row's last token, then mask the scores."""
        if self._started:
            for row, matcher in self.matchers.items():
                if not matcher.is_terminated() and not matcher.accept_token(int(input_ids[row, -1])):
                    # only a sampler that ignored the mask gets here: a bug, not bad input
                    raise RuntimeError(f"row {row} got token {int(input_ids[row, -1])}, which its grammar forbids")
        self._started = True
        live = [row for row, matcher in self.matchers.items() if not matcher.is_terminated()]
        for row in live:
            self.matchers[row].fill_next_token_bitmask(self.bitmask, row)
        if live:
            self._xgr.apply_token_bitmask_inplace(scores, self.bitmask.to(scores.device), indices=live)
        return scores
