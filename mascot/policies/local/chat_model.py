"""LangChain chat models on the local backend: one per role, each with its own adapter."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from operator import itemgetter
from typing import Any, Literal

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.exceptions import OutputParserException
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableLambda, RunnableMap, RunnablePassthrough
from langchain_core.runnables.config import run_in_executor
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mascot.messages import chat_messages
from mascot.policies.call_seed import call_seed
from mascot.policies.local.backend import LocalBackend
from mascot.policies.local.generation import cut_at_stop
from mascot.policies.thinking import chat_template_kwargs


class LocalChatModel(BaseChatModel):
    """A LangChain chat model answering from a ``LocalBackend`` with one adapter.

    Several instances share one backend, so each persona can have its own adapter on
    one base model in memory. Bound with ``logprobs=True`` (and ``top_logprobs=N``), a
    reply's ``response_metadata["logprobs"]`` holds its first token's N likeliest
    alternatives, as an OpenAI-compatible server reports them (the pairwise judge reads them).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    backend: LocalBackend
    adapter: str | None = None
    max_new_tokens: int = Field(default=256, ge=1)
    temperature: float = Field(default=0.7, ge=0.0)
    # None: the model's generation config's value (e.g. Qwen's top_k 20), else neutral
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    repetition_penalty: float | None = Field(default=None, gt=0.0)
    seed: int | None = None
    chat_template_kwargs: dict[str, Any] = Field(default_factory=chat_template_kwargs)

    @property
    def _llm_type(self) -> str:
        return "mascot-local"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model_name": self.backend.name, "adapter": self.adapter}

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        result = self.backend.generate(
            [chat_messages(messages)],
            adapters=[self.adapter],
            seed=self._seed(run_manager),
            stop=stop,
            json_schema=kwargs.get("json_schema"),
            **self._settings(kwargs),
        )[0]
        metadata = self._metadata()
        if kwargs.get("logprobs"):  # the first token's alternatives, in the OpenAI format
            top = self.backend.first_token_logprobs(chat_messages(messages), adapter=self.adapter,
                                                    top=max(1, int(kwargs.get("top_logprobs") or 1)),
                                                    chat_template_kwargs=self.chat_template_kwargs)
            metadata["logprobs"] = {"content": [{"token": top[0][0], "logprob": top[0][1], "top_logprobs": [
                {"token": token, "logprob": logprob} for token, logprob in top]}]}
        message = AIMessage(
            content=result.text,
            response_metadata=metadata,
            usage_metadata={
                "input_tokens": result.prompt_tokens,
                "output_tokens": result.completion_tokens,
                "total_tokens": result.prompt_tokens + result.completion_tokens,
            },
        )
        return ChatResult(generations=[ChatGeneration(message=message)])

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        """``_generate`` in one of the backend's caller threads, so that as many concurrent
        async calls as a batch holds can wait in its queue together."""
        return await run_in_executor(self.backend.callers, self._generate, messages, stop,
                                     run_manager.get_sync() if run_manager else None, **kwargs)

    def with_structured_output(
        self,
        schema: Mapping[str, Any] | type[BaseModel],
        *,
        method: Literal["json_schema"] = "json_schema",
        include_raw: bool = False,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, dict[str, Any] | BaseModel]:
        """This model with decoding constrained to JSON valid under ``schema``.

        An xgrammar grammar (compiled now, once per schema and backend) masks every token
        the schema does not allow, so replies are valid JSON with, e.g., ``enum`` values
        honoured, unless ``max_new_tokens`` cuts them: such a reply fails to parse
        (``parsed`` None, ``parsing_error`` set with ``include_raw``), it never raises
        from the model.

        Args:
            schema: A pydantic model class (parsed into an instance) or a JSON schema
                dict (parsed into a dict).
            method: ``json_schema``, the only method (no tool calling here).
            include_raw: Return ``{"raw": AIMessage, "parsed": ..., "parsing_error":
                Exception | None}`` like LangChain's other chat models; else the parsed
                value, raising ``OutputParserException`` when the reply does not parse.
            strict: Accepted for LangChain compatibility; the grammar is always strict.

        Returns:
            A runnable taking this model's input.

        Raises:
            ImportError: if xgrammar is not installed (it comes with the ``train`` extra).
            GrammarError: if the schema cannot be compiled.
            ValueError: on another ``method``, a schema of another kind, or unknown
                arguments.
        """
        if method != "json_schema":
            raise ValueError(f"the local backend supports method='json_schema' only, got {method!r}")
        if kwargs:
            raise ValueError(f"unsupported arguments: {', '.join(sorted(kwargs))}")
        json_schema, parse = _schema_parser(schema)
        # compiled here: a missing xgrammar or a bad schema fails at construction, and the
        # first call does not wait the ~2 s a compile takes on a real vocabulary
        self.backend.grammars.compile(json_schema)
        llm = self.bind(json_schema=json_schema,
                        ls_structured_output_format={"kwargs": {"method": method}, "schema": json_schema})
        parser = RunnableLambda(parse)
        if not include_raw:
            return llm | parser
        parsed = RunnablePassthrough.assign(parsed=itemgetter("raw") | parser, parsing_error=lambda _: None)
        unparsed = RunnablePassthrough.assign(parsed=lambda _: None)
        return RunnableMap(raw=llm) | parsed.with_fallbacks([unparsed], exception_key="parsing_error")

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        text = ""
        pieces = self.backend.stream(
            chat_messages(messages),
            adapter=self.adapter,
            seed=self._seed(run_manager),
            json_schema=kwargs.get("json_schema"),
            **self._settings(),
        )
        for piece in pieces:
            if stop and cut_at_stop(text + piece, stop) != text + piece:
                piece = cut_at_stop(text + piece, stop)[len(text) :]
                if piece:
                    yield self._chunk(piece, run_manager)
                break
            text += piece
            if piece:
                yield self._chunk(piece, run_manager)
        yield ChatGenerationChunk(
            message=AIMessageChunk(content="", response_metadata=self._metadata(), chunk_position="last")
        )

    def _chunk(
        self, piece: str, run_manager: CallbackManagerForLLMRun | None
    ) -> ChatGenerationChunk:
        chunk = ChatGenerationChunk(message=AIMessageChunk(content=piece))
        if run_manager:
            run_manager.on_llm_new_token(piece, chunk=chunk)
        return chunk

    def _settings(self, call: dict[str, Any] | None = None) -> dict[str, Any]:
        """Sampling settings: the model's, with a call's own ``max_tokens`` and ``temperature``
        (bound or passed to ``invoke``) in their place, as an OpenAI client sends them."""
        call = call or {}
        return {
            "max_new_tokens": call.get("max_tokens") or self.max_new_tokens,
            "temperature": call.get("temperature", self.temperature),
            "top_p": self.top_p,
            "top_k": self.top_k,
            "repetition_penalty": self.repetition_penalty,
            "chat_template_kwargs": self.chat_template_kwargs,
        }

    def _seed(self, run_manager: CallbackManagerForLLMRun | None) -> int | None:
        """The sampling seed of one call: ``seed`` mixed with the run's ``episode_id`` and
        ``sample`` metadata, LangGraph's ``langgraph_node`` and ``langgraph_step`` (set
        when the call runs inside a graph node) and the adapter. So repeated episodes,
        candidate samples, the nodes of one episode and its turns each draw from their own
        random stream, and each stays reproducible whatever order concurrent calls run in.
        """
        return call_seed(self.seed, run_manager.metadata if run_manager else None, self.adapter)

    def _metadata(self) -> dict[str, Any]:
        return {
            "model_name": self.backend.name,
            "adapter": self.adapter,
            "adapter_version": self.backend.adapter_versions.get(self.adapter) if self.adapter else None,
        }


def _schema_parser(schema: Any) -> tuple[dict[str, Any], Any]:
    """The JSON schema of ``schema`` and a parser of replies into its value.

    Raises:
        ValueError: if ``schema`` is neither a pydantic model class nor a dict.
    """
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        model = schema

        def parse_model(message: AIMessage) -> BaseModel:
            try:
                return model.model_validate(_json_object(message.text))
            except (json.JSONDecodeError, ValidationError) as exc:
                raise OutputParserException(f"not a valid {model.__name__}: {exc}", llm_output=message.text) from exc

        return model.model_json_schema(), parse_model
    if isinstance(schema, Mapping):

        def parse_object(message: AIMessage) -> dict[str, Any]:
            try:
                value = _json_object(message.text)
            except json.JSONDecodeError as exc:
                raise OutputParserException(f"not JSON: {exc}", llm_output=message.text) from exc
            if not isinstance(value, dict):
                raise OutputParserException("not a JSON object", llm_output=message.text)
            return value

        return dict(schema), parse_object
    raise ValueError(f"schema must be a pydantic model class or a JSON schema dict, got {type(schema).__name__}")


def _json_object(text: str) -> Any:
    """Parse a grammar-constrained reply leniently: raw control characters inside strings are
    read (the local grammar keeps them out, see ``grammar._json_grammar``; a grammar compiled
    by another xgrammar may not)."""
    return json.loads(text, strict=False)
