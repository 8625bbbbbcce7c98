"""LangGraph state graphs: the Director, persona speakers, the user turn, and baselines."""

from mascot.graphs.assembly import assemble_graph
from mascot.graphs.baselines import BASELINES, create_baseline_graph, rule_director
from mascot.graphs.direction import (
    DIRECTION_SCHEMA,
    DirectionError,
    StageDirection,
    fallback_direction,
    interpret_direction,
    read_direction_json,
)
from mascot.graphs.director import create_director_graph
from mascot.graphs.reply import clean_reply
from mascot.graphs.routes import DIRECTOR_NODE
from mascot.graphs.safety import SafetyGuard
from mascot.graphs.safety_detector import SafetyDetector
from mascot.graphs.state import (
    DirectorState,
    Fallback,
    persona_speakers,
    stage_directions,
)
from mascot.graphs.telemetry import OpenTelemetryTracer
from mascot.graphs.user import USER_NODE
from mascot.messages import openai_messages  # the episode format of a graph's messages

__all__ = [
    "BASELINES",
    "DIRECTION_SCHEMA",
    "DIRECTOR_NODE",
    "USER_NODE",
    "DirectionError",
    "DirectorState",
    "Fallback",
    "OpenTelemetryTracer",
    "SafetyDetector",
    "SafetyGuard",
    "StageDirection",
    "assemble_graph",
    "clean_reply",
    "create_baseline_graph",
    "create_director_graph",
    "fallback_direction",
    "interpret_direction",
    "openai_messages",
    "persona_speakers",
    "read_direction_json",
    "rule_director",
    "stage_directions",
]
