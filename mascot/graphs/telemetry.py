"""OpenTelemetry spans of a directed conversation, after the GenAI semantic conventions.

A LangChain callback handler: pass ``config={"callbacks": [OpenTelemetryTracer()]}`` to a
compiled director graph's ``invoke``/``ainvoke``/``stream`` (or to a parent graph that holds
it as a node). From LangGraph's callback metadata it builds one span tree per graph run::

    mascot.conversation                    one graph run (several rounds with a simulated person)
      mascot.round                         the round of each node's input state
        invoke_agent director              one Director decision (mascot.direction.*, handoff)
          chat <model>                     its model call (tokens, model, parameters)
        invoke_agent <persona id>          the voice's turn, handed over by the Director
          chat <model>
        invoke_agent user                  the turn back to the person (a simulated one's call)

Ids, names and numbers only: no message, prompt, reply, action or tone text goes into an
attribute or event unless ``record_content=True``; API keys never do. ``opentelemetry`` is
imported when a tracer is built, so this module imports without the ``otel`` extra.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, LLMResult
from langgraph.errors import GraphInterrupt
from langgraph.types import Command

from mascot.graphs.approval import APPROVAL_NODE
from mascot.graphs.routes import DIRECTOR_NODE
from mascot.graphs.user import USER_NODE

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, TracerProvider

#: The instrumentation scope the spans are recorded under.
SCOPE = "mascot.graphs"
_INSTALL = 'OpenTelemetryTracer needs OpenTelemetry: pip install "mascot[otel]"'


@dataclass
class _Run:
    """A LangChain run seen by the tracer: its parent, and its span if it has one."""

    parent: UUID | None
    start_ns: int
    span: Span | None = None
    context: Context | None = None  # the OpenTelemetry context current when a root run started


@dataclass
class _Conversation:
    """The open spans of one director-graph run."""

    span: Span
    round: int = -1
    round_span: Span | None = None
    rounds: int = 0


class OpenTelemetryTracer(BaseCallbackHandler):
    """A callback handler that records a directed conversation as OpenTelemetry spans.

    Args:
        tracer_provider: Where the spans go; ``None`` uses the global provider
            (``opentelemetry.trace.set_tracer_provider``).
        record_content: Also record the prompts, replies and directions' text as span
            events (``gen_ai.content.prompt``, ``gen_ai.content.completion``,
            ``mascot.direction``). Off by default: a person's words are theirs.
        roster: The roster id to set as ``mascot.roster`` on conversation and round spans.

    Raises:
        ImportError: if OpenTelemetry is not installed (the ``otel`` extra).
    """

    run_inline = True  # quick, lock-guarded bookkeeping: called in order, on the event loop too

    def __init__(self, tracer_provider: TracerProvider | None = None, *, record_content: bool = False,
                 roster: str | None = None) -> None:
        try:
            from opentelemetry import context, trace
        except ImportError as exc:
            raise ImportError(_INSTALL) from exc
        self._trace = trace
        self._context = context
        self._tracer = trace.get_tracer(SCOPE, tracer_provider=tracer_provider)
        self.record_content = record_content
        self.roster = roster
        self._runs: dict[UUID, _Run] = {}
        self._conversations: dict[UUID, _Conversation] = {}
        self._lock = threading.Lock()

    # --- chains: graphs and their nodes ------------------------------------------------------

    def on_chain_start(self, serialized: dict[str, Any] | None, inputs: Any, *, run_id: UUID,
                       parent_run_id: UUID | None = None, tags: list[str] | None = None,
                       metadata: dict[str, Any] | None = None, **kwargs: Any) -> None:
        """Open a direction, voice-turn or person-turn span for a director-graph node."""
        with self._lock:
            run = self._register(run_id, parent_run_id)
            role = _node_role(kwargs.get("name"), inputs, tags or [], metadata or {})
            if role is None or parent_run_id is None:
                return
            round_span = self._round_span(parent_run_id, int(inputs.get("round") or 0), metadata or {})
            attributes: dict[str, Any] = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": role,
                                          "mascot.round": int(inputs.get("round") or 0)}
            directions = inputs.get("directions") or []
            if role != DIRECTOR_NODE and directions and directions[-1].get("speaker") == role:
                attributes["mascot.handoff.from"] = DIRECTOR_NODE
            run.span = self._tracer.start_span(f"invoke_agent {role}", context=self._trace.set_span_in_context(
                round_span), kind=self._trace.SpanKind.INTERNAL, attributes=attributes)

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        """Close a node's span with what it decided; close a graph run's round and conversation."""
        self._end(run_id, None, lambda span: self._node_outcome(span, outputs))

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """Close a node's or graph run's spans with an error status (an interrupt is no error)."""
        self._end(run_id, error)

    # --- model calls ------------------------------------------------------------------------

    def on_chat_model_start(self, serialized: dict[str, Any] | None, messages: list[list[BaseMessage]], *,
                            run_id: UUID, parent_run_id: UUID | None = None, tags: list[str] | None = None,
                            metadata: dict[str, Any] | None = None, **kwargs: Any) -> None:
        """Open a ``chat <model>`` span under the node (or other span) that made the call."""
        with self._lock:
            run = self._register(run_id, parent_run_id)
            metadata = metadata or {}
            params = kwargs.get("invocation_params") or {}
            model = metadata.get("ls_model_name") or params.get("model") or params.get("model_name")
            attributes: dict[str, Any] = {"gen_ai.operation.name": "chat"}
            optional = {
                "gen_ai.request.model": model,
                "gen_ai.provider.name": metadata.get("ls_provider"),
                "gen_ai.request.temperature": _first(metadata.get("ls_temperature"), params.get("temperature")),
                "gen_ai.request.max_tokens": _first(metadata.get("ls_max_tokens"), params.get("max_tokens"),
                                                    params.get("max_completion_tokens")),
            }
            attributes.update({key: value for key, value in optional.items() if value is not None})
            run.span = self._tracer.start_span(f"chat {model}" if model else "chat",
                                               context=self._parent_context(parent_run_id),
                                               kind=self._trace.SpanKind.CLIENT, attributes=attributes)
            if self.record_content:
                prompt = [{"role": m.type, **({"name": m.name} if m.name else {}), "content": m.text}
                          for batch in messages for m in batch]
                run.span.add_event("gen_ai.content.prompt", {"gen_ai.prompt": json.dumps(prompt)})

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        """Close a model-call span with the response model and the token counts."""
        self._end(run_id, None, lambda span: _record_response(span, response, self.record_content))

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """Close a model-call span with an error status."""
        self._end(run_id, error)

    # --- other runs keep the parent chain unbroken --------------------------------------------

    def on_tool_start(self, serialized: dict[str, Any] | None, input_str: str, *, run_id: UUID,
                      parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        """Remember a tool run, so that a model call inside it finds its node's span."""
        with self._lock:
            self._register(run_id, parent_run_id)

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        """Forget a tool run."""
        self._end(run_id, None)

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """Forget a tool run."""
        self._end(run_id, None)

    # --- bookkeeping ------------------------------------------------------------------------

    def _register(self, run_id: UUID, parent_run_id: UUID | None) -> _Run:
        run = _Run(parent=parent_run_id, start_ns=time.time_ns())
        if parent_run_id is None or parent_run_id not in self._runs:
            run.context = self._context.get_current()  # an app's own span parents the tree
        self._runs[run_id] = run
        return run

    def _end(self, run_id: UUID, error: BaseException | None,
             outcome: Callable[[Span], None] | None = None) -> None:
        """Close a run's span with its outcome or its error, and a graph run's conversation."""
        with self._lock:
            run = self._runs.pop(run_id, None)
            if run is not None and run.span is not None:
                if error is not None:
                    self._fail(run.span, error)
                elif outcome is not None:
                    outcome(run.span)
                run.span.end()
            self._close_conversation(run_id, error)

    def _parent_context(self, run_id: UUID | None) -> Context | None:
        """The context of the nearest span above a run (or of the app, above the root run)."""
        run = self._runs.get(run_id) if run_id is not None else None
        while run is not None:
            if run.span is not None:
                return self._trace.set_span_in_context(run.span)
            if run.context is not None:
                return run.context
            run = self._runs.get(run.parent) if run.parent is not None else None
        return None

    def _round_span(self, graph_id: UUID, index: int, metadata: dict[str, Any]) -> Span:
        """The open round span of a graph run, a new one when the round changed."""
        conversation = self._conversations.get(graph_id)
        if conversation is None:
            attributes: dict[str, Any] = {} if self.roster is None else {"mascot.roster": self.roster}
            if metadata.get("thread_id") is not None:
                attributes["gen_ai.conversation.id"] = str(metadata["thread_id"])
            graph = self._runs.get(graph_id)
            span = self._tracer.start_span("mascot.conversation", context=self._parent_context(graph_id),
                                           attributes=attributes, start_time=graph.start_ns if graph else None)
            conversation = self._conversations[graph_id] = _Conversation(span)
        if conversation.round_span is None or conversation.round != index:
            if conversation.round_span is not None:
                conversation.round_span.end()
            attributes = {"mascot.round": index, **({} if self.roster is None else {"mascot.roster": self.roster})}
            conversation.round_span = self._tracer.start_span(
                "mascot.round", context=self._trace.set_span_in_context(conversation.span), attributes=attributes)
            conversation.round, conversation.rounds = index, conversation.rounds + 1
        return conversation.round_span

    def _close_conversation(self, graph_id: UUID, error: BaseException | None) -> None:
        conversation = self._conversations.pop(graph_id, None)
        if conversation is None:
            return
        if conversation.round_span is not None:
            conversation.round_span.end()
        conversation.span.set_attribute("mascot.rounds", conversation.rounds)
        if error is not None:
            self._fail(conversation.span, error)
        conversation.span.end()

    def _node_outcome(self, span: Span, outputs: Any) -> None:
        """A Director node's decision (its ``Command``), or a voice turn that was skipped."""
        if isinstance(outputs, Command):
            update = outputs.update if isinstance(outputs.update, dict) else {}
            directions = update.get("directions") or ([update["proposed"]] if update.get("proposed") else None)
            if update.get("proposed"):  # approve=True: the app answers before the voice speaks
                span.set_attribute("mascot.direction.approval", "asked")
            if update.get("approvals"):
                span.set_attribute("mascot.approval.decision", str(update["approvals"][-1].get("decision")))
            if directions:
                direction = directions[-1]
                span.set_attribute("mascot.direction.speaker", str(direction.get("speaker")))
                span.set_attribute("mascot.direction.fallback", bool(direction.get("fallback")))
                span.set_attribute("mascot.direction.offered", [str(v) for v in direction.get("offered") or []])
                span.set_attribute("mascot.handoff.to", str(direction.get("speaker")))
                if self.record_content:
                    text = {k: str(direction[k]) for k in ("action", "tone", "rationale", "fallback")
                            if direction.get(k)}
                    span.add_event("mascot.direction", text)
            return
        if isinstance(outputs, dict) and "round_turns" in outputs and "messages" not in outputs:
            span.set_attribute("mascot.turn.skipped", True)  # the reason quotes the reply: not recorded

    def _fail(self, span: Span, error: BaseException) -> None:
        if isinstance(error, GraphInterrupt):
            span.set_attribute("mascot.interrupted", True)
            return
        span.set_attribute("error.type", type(error).__qualname__)
        # the message may quote a prompt or a reply: only the type unless content is recorded
        description = f"{type(error).__qualname__}: {error}" if self.record_content else type(error).__qualname__
        span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, description))
        if self.record_content:
            span.record_exception(error)


def _node_role(name: Any, inputs: Any, tags: Sequence[str], metadata: dict[str, Any]) -> str | None:
    """``director``, ``user`` or a persona id for a node run of a director graph, else ``None``.

    A node run is named as its node and tagged with its step; a persona's node is the one the
    Director's last direction in its input state names.
    """
    if not isinstance(inputs, dict) or name != metadata.get("langgraph_node"):
        return None
    if not any(tag.startswith("graph:step:") for tag in tags):
        return None
    if name in (DIRECTOR_NODE, USER_NODE, APPROVAL_NODE):
        return name
    directions = inputs.get("directions") or []
    return name if directions and isinstance(directions[-1], dict) and directions[-1].get("speaker") == name else None


def _record_response(span: Span, response: LLMResult, record_content: bool) -> None:
    """Response model, finish reason and token counts of a model call (and its reply, if asked)."""
    output = response.llm_output or {}
    generation = response.generations[0][0] if response.generations and response.generations[0] else None
    message = generation.message if isinstance(generation, ChatGeneration) else None
    metadata = message.response_metadata if message is not None else {}
    usage = (message.usage_metadata if isinstance(message, AIMessage) else None) or {}
    token_usage = output.get("token_usage") or {}
    attributes = {
        "gen_ai.response.model": _first(output.get("model_name"), metadata.get("model_name"), metadata.get("model")),
        "gen_ai.response.id": metadata.get("id"),
        "gen_ai.usage.input_tokens": _first(usage.get("input_tokens"), token_usage.get("prompt_tokens")),
        "gen_ai.usage.output_tokens": _first(usage.get("output_tokens"),
                                             token_usage.get("completion_tokens")),
    }
    for key, value in attributes.items():
        if value is not None:
            span.set_attribute(key, value)
    if metadata.get("finish_reason"):
        span.set_attribute("gen_ai.response.finish_reasons", [str(metadata["finish_reason"])])
    if record_content and generation is not None:
        span.add_event("gen_ai.content.completion", {"gen_ai.completion": generation.text})


def _first(*values: Any) -> Any:
    """The first value that is not ``None``."""
    return next((value for value in values if value is not None), None)
