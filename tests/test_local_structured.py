"""Grammar-constrained structured output of the local backend (xgrammar)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Literal

import pytest
from langchain_core.exceptions import OutputParserException
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from pydantic import BaseModel, Field
from test_local_backend import concurrently, record_calls

from mascot.graphs.decider import _model_text
from mascot.policies.local import LocalBackend
from mascot.policies.local.chat_model import LocalChatModel
from mascot.policies.local.grammar import GrammarError

SPEAKERS = ["anchor", "catalyst", "beacon", "action_guide"]
DIRECTION = {
    "type": "object",
    "properties": {"speaker": {"enum": SPEAKERS}, "action": {"type": "string", "maxLength": 12},
                   "tone": {"type": "string", "maxLength": 8}},
    "required": ["speaker", "action", "tone"],
}
PROMPT = [SystemMessage("You direct the conversation. Answer with JSON."), HumanMessage("I failed my exam again")]


class Direction(BaseModel):
    speaker: Literal["anchor", "catalyst", "beacon", "action_guide"]
    action: str = Field(max_length=12)  # the grammar bounds the strings: a random model rambles
    tone: str = Field(max_length=8)


@pytest.fixture(scope="module")
def backend(tiny_model: Path) -> LocalBackend:
    adapters = {p.name: p for p in sorted((tiny_model / "adapters").iterdir()) if p.is_dir()}
    return LocalBackend.load(str(tiny_model), adapters=adapters)


def test_include_raw_returns_raw_parsed_and_error_with_the_enum_honoured(backend: LocalBackend) -> None:
    for seed in range(4):
        model = LocalChatModel(backend=backend, temperature=1.0, seed=seed, max_new_tokens=60)
        out = model.with_structured_output(DIRECTION, method="json_schema", include_raw=True).invoke(PROMPT)
        assert set(out) == {"raw", "parsed", "parsing_error"} and isinstance(out["raw"], AIMessage)
        assert out["parsing_error"] is None, out
        assert out["parsed"] == json.loads(out["raw"].text, strict=False)  # raw control characters in strings allowed
        assert out["parsed"]["speaker"] in SPEAKERS and set(out["parsed"]) == {"speaker", "action", "tone"}
        assert _model_text(out) == out["parsed"]  # what the Director reads


def test_a_pydantic_class_parses_into_an_instance(backend: LocalBackend) -> None:
    model = LocalChatModel(backend=backend, adapter="anchor", temperature=0.8, seed=1, max_new_tokens=60)
    direction = model.with_structured_output(Direction).invoke(PROMPT)
    assert isinstance(direction, Direction) and direction.speaker in SPEAKERS


def test_a_reply_cut_by_max_new_tokens_fails_to_parse_without_raising(backend: LocalBackend) -> None:
    model = LocalChatModel(backend=backend, temperature=1.0, seed=0, max_new_tokens=4)
    out = model.with_structured_output(DIRECTION, include_raw=True).invoke(PROMPT)
    assert out["parsed"] is None and isinstance(out["parsing_error"], OutputParserException)
    raw = out["raw"].text  # the grammar's start, cut after 4 tokens (e.g. '{"spea')
    assert len(raw) >= 4 and '{"speaker"'.startswith(raw), raw
    with pytest.raises(OutputParserException):
        model.with_structured_output(DIRECTION).invoke(PROMPT)


def test_streaming_and_async_follow_the_grammar(backend: LocalBackend) -> None:
    import asyncio

    model = LocalChatModel(backend=backend, temperature=1.0, seed=2, max_new_tokens=60)
    structured = model.with_structured_output(DIRECTION, include_raw=True)
    assert asyncio.run(structured.ainvoke(PROMPT))["parsed"] == structured.invoke(PROMPT)["parsed"]
    text = "".join(chunk.text for chunk in model.bind(json_schema=DIRECTION).stream(PROMPT))
    assert text == structured.invoke(PROMPT)["raw"].text


def test_constrained_and_free_calls_share_a_batch(backend: LocalBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    schema_b = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    conversation = [{"role": "user", "content": "I failed my exam again"}]
    calls = [{"json_schema": DIRECTION}, {}, {"json_schema": schema_b}, {"json_schema": DIRECTION}, {}]
    alone = [backend.generate([conversation], temperature=1.0, seed=i, max_new_tokens=60, **c)
             for i, c in enumerate(calls)]
    rows = record_calls(monkeypatch, backend)
    outcomes = concurrently([lambda i=i, c=c: backend.generate([conversation], temperature=1.0, seed=i,
                                                               max_new_tokens=60, **c) for i, c in enumerate(calls)])
    assert rows == [1, 4], rows
    assert outcomes == alone
    assert json.loads(outcomes[0][0].text)["speaker"] in SPEAKERS and "n" in json.loads(outcomes[2][0].text)


def test_each_schema_compiles_once(backend: LocalBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    model = LocalChatModel(backend=backend, temperature=0, max_new_tokens=8)
    schema = {"type": "object", "properties": {"mood": {"enum": ["calm", "tense"]}}, "required": ["mood"]}
    model.with_structured_output(schema)
    compiler = backend.grammars._compiler
    compiled: list[str] = []
    compile_grammar = compiler.compile_grammar
    monkeypatch.setattr(compiler, "compile_grammar",
                        lambda grammar, **kw: compiled.append(str(grammar)) or compile_grammar(grammar, **kw),
                        raising=False)
    for candidate in (schema, json.loads(json.dumps(schema)), schema):  # equal schemas: no compile
        model.with_structured_output(candidate, include_raw=True).invoke(PROMPT)
    assert compiled == []
    # key order is part of the key, since the order of properties is the order they are written in
    reordered = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "integer"}}}
    model.with_structured_output(reordered)
    model.with_structured_output({**reordered, "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}})
    assert len(compiled) == 2


def test_errors_at_construction(backend: LocalBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    model = LocalChatModel(backend=backend)
    with pytest.raises(GrammarError, match="unsupported JSON schema: Unsupported type \"nonsense\""):
        model.with_structured_output({"type": "nonsense"})
    with pytest.raises(ValueError, match="method='json_schema' only"):
        model.with_structured_output(DIRECTION, method="function_calling")
    with pytest.raises(ValueError, match="pydantic model class or a JSON schema dict"):
        model.with_structured_output("speaker")
    fresh = LocalBackend(backend.model, backend.tokenizer, name="fresh")
    monkeypatch.setitem(sys.modules, "xgrammar", None)  # as if it were not installed
    with pytest.raises(ImportError, match=r"needs xgrammar: pip install 'mascot\[train\]'"):
        LocalChatModel(backend=fresh).with_structured_output(DIRECTION)


@pytest.mark.parametrize("text", ["calm", "a\x07b", "tab\there", ""])
def test_length_bounded_strings_take_no_control_characters(backend: LocalBackend, text: str) -> None:
    import xgrammar

    matcher = xgrammar.GrammarMatcher(backend.grammars.compile(DIRECTION))
    reply = json.dumps({"speaker": "anchor", "action": "x", "tone": text}, ensure_ascii=False)
    # json.dumps escapes control characters; the raw reply is what a sampler could write
    raw = reply.replace("\\u0007", "\x07").replace("\\t", "\t")
    assert matcher.accept_string(raw) is (text == "calm" or text == "")
