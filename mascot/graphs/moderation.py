"""An app's own crisis detector in the safety guard: a callable, or a chat model asked in
Llama Guard's conversation format.

``create_director_graph(safety=...)`` takes either in place of the built-in detector
(``mascot.graphs.safety_detector.SafetyDetector``); the guard keeps the roster's routes, the
resources, the running risk and persistence around it. A callable gets the person's
messages, oldest first, and returns the name of the rule they call for, or ``None``. A chat
model (Llama Guard served by vLLM on a GPU, or any LangChain chat model) reads the roster's
rules as the unsafe-content categories S1, S2, ... and the conversation, and answers
``safe``, or ``unsafe`` and the categories on a second line. A call that fails, or an answer
that is neither, leaves the decision to the built-in detector, logged and counted in
``failures``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import HumanMessage

from mascot.graphs.safety_detector import Detection, SafetyDetector
from mascot.rosters import SafetyRule

logger = logging.getLogger(__name__)

#: What an app's callable detector is: the person's messages, oldest first -> a rule name or None.
AppDetector = Callable[[Sequence[str]], "str | None"]

#: Llama Guard's conversation prompt (its model card's format), with the roster's rules as categories.
LLAMA_GUARD_PROMPT = """Task: Check if there is unsafe content in 'User' messages in conversations according to our \
safety policy with the below categories.

<BEGIN UNSAFE CONTENT CATEGORIES>
{categories}
<END UNSAFE CONTENT CATEGORIES>

<BEGIN CONVERSATION>

{conversation}

<END CONVERSATION>

Provide your safety assessment for ONLY THE LAST User message in the above conversation:
 - First line must read 'safe' or 'unsafe'.
 - If unsafe, a second line must include a comma-separated list of violated categories."""


def llama_guard_prompt(rules: Sequence[SafetyRule], said: Sequence[str]) -> str:
    """The Llama Guard prompt for the person's messages ``said`` (oldest first): each rule a
    category ``S<n>: <name>. <description>``."""
    categories = "\n".join(f"S{i}: {rule.name}. {rule.description}" for i, rule in enumerate(rules, 1))
    conversation = "\n\n".join(f"User: {text}" for text in said)
    return LLAMA_GUARD_PROMPT.format(categories=categories, conversation=conversation)


def parse_llama_guard(answer: str, rules: Sequence[SafetyRule]) -> str | None:
    """The rule a Llama Guard answer names (the first of its categories), or ``None`` for ``safe``.

    Raises:
        ValueError: on an answer that is neither ``safe`` nor ``unsafe`` with known categories.
    """
    lines = [line.strip() for line in answer.strip().splitlines() if line.strip()]
    if lines and lines[0].lower() == "safe":
        return None
    if not lines or lines[0].lower() != "unsafe":
        raise ValueError(f"not a Llama Guard answer: {answer.strip()[:80]!r}")
    numbers = [int(n) for n in re.findall(r"S(\d+)", " ".join(lines[1:]))]
    named = [rules[n - 1].name for n in numbers if 1 <= n <= len(rules)]
    if not named:
        raise ValueError(f"unsafe without a category of this roster: {answer.strip()[:80]!r}")
    return named[0]


class ModeratedDetector:
    """The safety guard's detector when an app brings its own: a callable or a chat model
    decides, the built-in ``SafetyDetector`` when it fails (and for the running risk's
    classifier signal)."""

    def __init__(self, rules: Sequence[SafetyRule], judge: AppDetector | BaseChatModel, *,
                 fallback: SafetyDetector | None = None) -> None:
        """Args:
            rules: The roster's safety rules.
            judge: The app's detector: a callable (messages -> rule name or None), or a chat
                model answering in Llama Guard's format.
            fallback: Decides where the judge fails; default a ``SafetyDetector`` of ``rules``.
        """
        self.rules = list(rules)
        self.judge = judge
        self.fallback = fallback or SafetyDetector(self.rules)
        self.failures = 0

    def detect(self, message: str, context: Sequence[str] = ()) -> Detection | None:
        """The rule the conversation calls for after the person's latest ``message``, or ``None``."""
        said = [*context, message]
        name = self._judge_name()
        try:
            if isinstance(self.judge, BaseChatModel):
                answer = self.judge.invoke([HumanMessage(llama_guard_prompt(self.rules, said))])
                rule = parse_llama_guard(answer.text, self.rules)
            else:
                rule = self.judge(said)
                if rule is not None and rule not in {r.name for r in self.rules}:
                    raise ValueError(f"returned '{rule}', not a rule of this roster")
        except Exception as exc:  # a server fault or a malformed answer: the built-in detector decides
            self.failures += 1
            logger.warning("safety: the app's detector %s failed (%s); the built-in detector decides", name,
                           str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)
            return self.fallback.detect(message, context)
        return Detection(rule, "app", 1.0, name) if rule else None

    def signal(self, message: str, context: Sequence[str] = ()) -> dict[str, float]:
        """The built-in classifiers' probability of each rule (the running risk's signal)."""
        return self.fallback.signal(message, context)

    def head(self) -> object:
        """The built-in classifier (loaded now)."""
        return self.fallback.head()

    def describe(self) -> str:
        """One line: which detector decides, and which takes over when it fails."""
        return f"safety detector: the app's {self._judge_name()}; when it fails, {self.fallback.describe()[17:]}"

    def _judge_name(self) -> str:
        if isinstance(self.judge, BaseChatModel):
            return f"chat model {getattr(self.judge, 'model_name', None) or type(self.judge).__name__}"
        return f"callable {getattr(self.judge, '__name__', type(self.judge).__name__)}"


#: The question of the second opinion: strict JSON, one rule or none.
SECOND_OPINION_PROMPT = """You check a conversation with a person for a crisis that needs a fixed response.

The crises:
{rules}

The person's messages, oldest first:
{conversation}

Does the person, in their own life and now, call for one of the crises above? Stories, other \
people, idioms and past events that are over do not. Answer with JSON only, no other text: \
{{"rule": "<one of {names}>"}} or {{"rule": null}}."""


def parse_second_opinion(answer: str, rules: Sequence[SafetyRule]) -> str | None:
    """The rule a second opinion names, or ``None``.

    Raises:
        ValueError: on an answer that is not exactly ``{"rule": <a rule name or null>}``.
    """
    import json

    text = answer.strip().removeprefix("```json").removeprefix("```").removesuffix("```").strip()
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        raise ValueError(f"not JSON: {answer.strip()[:80]!r}") from None
    if not isinstance(value, dict) or set(value) != {"rule"}:
        raise ValueError(f'not {{"rule": ...}}: {answer.strip()[:80]!r}')
    rule = value["rule"]
    if rule is not None and rule not in {r.name for r in rules}:
        raise ValueError(f"names no rule of this roster: {rule!r}")
    return rule


class SecondOpinion:
    """A language model asked about the whole conversation where the running risk is unsure
    (``risk.ASK`` to ``risk.FIRE``): ``SafetyGuard(second_opinion=...)``."""

    def __init__(self, rules: Sequence[SafetyRule], model: BaseChatModel) -> None:
        """Args:
            rules: The roster's safety rules.
            model: Any LangChain chat model (the offline 1.5B through ``mascot serve``, a hosted one).
        """
        self.rules = list(rules)
        self.model = model
        self.calls = 0
        self.failures = 0
        self.seconds = 0.0

    def ask(self, said: Sequence[str]) -> str | None:
        """The rule the model says the person's messages ``said`` call for, or ``None`` (also
        when the call fails or the answer is malformed: logged and counted in ``failures``)."""
        import time

        rules = "\n".join(f"- {rule.name}: {rule.description}" for rule in self.rules)
        prompt = SECOND_OPINION_PROMPT.format(rules=rules, conversation="\n".join(f"- {t}" for t in said),
                                              names=", ".join(r.name for r in self.rules))
        self.calls += 1
        start = time.perf_counter()
        try:
            return parse_second_opinion(self.model.invoke([HumanMessage(prompt)]).text, self.rules)
        except Exception as exc:  # a server fault or a malformed answer: the cheaper signal's decision stands
            self.failures += 1
            logger.warning("safety: the second opinion failed (%s); the running risk decides",
                           str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)
            return None
        finally:
            self.seconds += time.perf_counter() - start
