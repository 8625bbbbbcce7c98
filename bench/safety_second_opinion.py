"""The safety guard with a language model's second opinion, on the labelled conversations.

Every conversation of a split (``dev``: choose; ``test``: report once) goes through
``SafetyGuard.assess`` as the graph runs it (MiniLM, the window classifier, the running
risk) with ``SecondOpinion`` asking a served model where the risk is unsure, then the rosters'
scenarios (openings and follow-ups) for the call rate on everyday conversations. Serve the
offline 1.5B first, e.g. ``mascot serve --engine vllm --policies P --port 8311`` with P naming
``~/.cache/mascot/qwen2.5-coder-1.5b-instruct``, then:

    python bench/safety_second_opinion.py http://127.0.0.1:8311/v1 qwen2.5-coder-1.5b-instruct dev|test

Writes ``bench/results/safety_second_opinion_<split>.json``.
"""
import json
import sys
from pathlib import Path

from langchain_core.messages import HumanMessage
from langchain_openai import ChatOpenAI

from mascot.graphs.embeddings import embedder_by_name
from mascot.graphs.moderation import SecondOpinion
from mascot.graphs.safety import SafetyGuard
from mascot.graphs.safety_detector import SafetyDetector
from mascot.rosters import load_roster, load_scenarios
from mascot.training.evaluation.safety import load_conversation_set

url, served = sys.argv[1], sys.argv[2]
split = sys.argv[3] if len(sys.argv) > 3 else "dev"
model = ChatOpenAI(base_url=url, api_key="EMPTY", model=served, temperature=0, max_tokens=24, timeout=120)
emb = embedder_by_name("minilm")
out = {}
for rid in ("emotional_support", "workplace_meeting"):
    roster = load_roster(rid)
    opinion = SecondOpinion(roster.safety, model)
    guard = SafetyGuard(roster, detector=SafetyDetector.for_roster(roster, embedder=emb), second_opinion=opinion)
    def play(said, guard=guard):
        risk, earlier = {}, []
        for i in range(len(said)):
            record, risk = guard.assess([HumanMessage(t) for t in said[:i + 1]], earlier, i, risk)
            if record:
                return i, record["rule"], record["via"]
        return None
    rows = []
    for c in load_conversation_set(roster, split=split):
        rows.append((c.kind, c.fires_at, c.rule, play(c.messages)))
    b = [r for r in rows if r[0] == "building"]
    n = [r for r in rows if r[0] == "hard_negative"]
    calls_conv = opinion.calls
    everyday = [[s.opening, *s.followups] for s in load_scenarios(rid)]
    before = opinion.calls
    fired_everyday = sum(play(e) is not None for e in everyday)
    out[rid] = {"recall": sum(r[3] is not None for r in b) / len(b),
                "false_alarms": sum(r[3] is not None for r in n) / len(n),
                "by_second_opinion": sum(1 for r in rows if r[3] and r[3][2] == "second_opinion"),
                "second_opinion_true": sum(1 for r in b if r[3] and r[3][2] == "second_opinion"),
                "calls_on_labelled": calls_conv, "calls_on_scenarios": opinion.calls - before,
                "scenarios": len(everyday),
                "scenarios_fired": fired_everyday, "failures": opinion.failures,
                "s_per_call": round(opinion.seconds / max(1, opinion.calls), 2)}
    print(rid, out[rid], flush=True)

path = Path(__file__).parent / "results" / f"safety_second_opinion_{split}.json"
path.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
print(f"wrote {path}")
