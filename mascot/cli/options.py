"""Command-line options shared by several ``mascot`` commands: models, numbers, secrets."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from rich.console import Console

from mascot.redaction import RedactingFilter, Redactor, add_secret_variables, file_redactor
from mascot.rosters import Roster, Scenario, load_scenarios, roster_path, scenario_path

if TYPE_CHECKING:  # imported where used: `mascot --help` and `rosters` load no LangChain
    from mascot.policies import Policies, PolicySpec

DEFAULT_MODEL = "Qwen/Qwen3-0.6B"
#: Values of the tuning flags when neither they nor a policy file set them (the reply
#: budgets default per role: ``mascot.policies.spec.ROLE_MAX_TOKENS``).
_DEFAULTS = {"temperature": 0.7, "timeout": 60.0}
#: The baseline graphs' names, for the flags that choose one without loading LangGraph
#: (``mascot.graphs.BASELINES``; a test keeps the two equal).
BASELINES = ("single", "round_robin", "random", "all")
#: Roles a ``--max-tokens role=N`` budget may name; ``speakers`` means every persona.
BUDGET_ROLES = ("director", "speakers", "user", "judge")
#: The help of flags several commands share.
ROSTER_HELP = "a shipped roster's id (mascot rosters lists them) or a roster folder or YAML file"
CONCURRENCY_HELP = "model requests in flight at once"
METHOD_HELP = "grpo: sample and score with the reward terms; dpo: fit on preference pairs"

#: Where commands print results (stdout) and progress, warnings and errors (stderr).
out = Console(highlight=False, soft_wrap=True, emoji=False)
err = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)


class UsageError(Exception):
    """A user mistake on the command line; printed as one line, exit code 2."""


def add_policy_flags(parser: argparse.ArgumentParser) -> None:
    """Add the flags that choose the models: ``--model``, ``--policies``, ``--base-url``..."""
    group = parser.add_argument_group("models (one of)")
    group.add_argument("--model", metavar="HF_ID_OR_PATH",
                       help=f"local model for every role (default {DEFAULT_MODEL}); with "
                            "--base-url, the served model name")
    group.add_argument("--policies", metavar="FILE", help="policy file: a model per role")
    group.add_argument("--base-url", metavar="URL[,URL...]",
                       help="OpenAI-compatible endpoint; several (replicas) spread the requests")
    group.add_argument("--api-key-env", metavar="VAR",
                       help="environment variable with the endpoint's API key")
    group.add_argument("--engine", choices=("local", "vllm"), default="local",
                       help="what runs the local models: local (in-process transformers, the default) or "
                            "vllm (one vLLM server for this command, from scripts/install --vllm)")
    group.add_argument("--max-tokens", type=budgets, metavar="N|ROLE=N,...",
                       help="reply budgets in tokens: N for every role, or per role, e.g. "
                            "director=160,speakers=160,user=96,judge=512 (the defaults; "
                            "with --policies: overrides the file)")
    group.add_argument("--temperature", type=float, metavar="T",
                       help=f"sampling temperature (default {_DEFAULTS['temperature']}; "
                            "with --policies: overrides every role)")
    group.add_argument("--timeout", type=positive_float, metavar="S",
                       help=f"seconds per request to a server (default {_DEFAULTS['timeout']:g}; "
                            "with --policies: overrides every role)")


def positive(text: str) -> int:
    """An argparse type: an integer >= 1."""
    return _integer(text, minimum=1)


def non_negative(text: str) -> int:
    """An argparse type: an integer >= 0."""
    return _integer(text, minimum=0)


def _integer(text: str, *, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: '{text}'") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
    return value


def budgets(text: str) -> dict[str, int]:
    """An argparse type: ``N`` (every role, key ``*``) or ``role=N,...`` reply budgets."""
    if "=" not in text:
        return {"*": positive(text)}
    found: dict[str, int] = {}
    for item in text.split(","):
        role, _, value = item.partition("=")
        role = role.strip()
        if role not in BUDGET_ROLES:
            raise argparse.ArgumentTypeError(f"unknown role '{role}' in '{text}'; roles: {', '.join(BUDGET_ROLES)}")
        found[role] = positive(value.strip())
    return found


def with_budgets(policies: Policies, given: dict[str, int] | None) -> Policies:
    """``policies`` with the ``--max-tokens`` budgets applied to the roles they name.

    Every named role gets an entry of its own (a copy of the spec it answered with), so a
    budget for the speakers never reaches the Director through ``default``.
    """
    from mascot.policies import Policies

    if not given:
        return policies
    if "*" in given:
        specs = {role: spec.model_copy(update={"max_tokens": given["*"]}) for role, spec in policies.specs.items()}
        return Policies(specs, policies.roster, seed=policies.seed)
    specs = dict(policies.specs)
    for role, tokens in given.items():
        names = policies.roster.persona_ids if role == "speakers" else [role]
        for name in names:
            specs[name] = policies.spec(name).model_copy(update={"max_tokens": tokens})
    return Policies(specs, policies.roster, seed=policies.seed)


def positive_float(text: str) -> float:
    """An argparse type: a number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: '{text}'") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def policies_from_args(args: argparse.Namespace, roster: Roster) -> Policies:
    """Build the policies of the model flags (``--policies``, ``--base-url``, ``--model``).

    Raises:
        UsageError: on conflicting flags.
    """
    from mascot.policies import Policies, load_policy_specs

    if args.policies and (args.base_url or args.model):
        raise UsageError("use either --policies or --model/--base-url, not both")
    given = {k: getattr(args, k) for k in _DEFAULTS if getattr(args, k) is not None}
    if args.policies:
        specs = load_policy_specs(args.policies, roster)
        return with_budgets(Policies({role: spec_from_flags({**spec.model_dump(), **given})
                                      for role, spec in specs.items()}, roster, seed=args.seed), args.max_tokens)
    tuning = {**_DEFAULTS, **given}
    if args.base_url:
        if not args.model:
            raise UsageError("--base-url needs --model NAME (the served model or adapter name)")
        urls = [url.strip() for url in args.base_url.split(",") if url.strip()]
        spec = spec_from_flags(dict(kind="openai", model=args.model, base_url=urls[0] if len(urls) == 1 else urls,
                          api_key_env=args.api_key_env, **tuning))
    else:
        if args.api_key_env:
            raise UsageError("--api-key-env only applies with --base-url")
        spec = spec_from_flags(dict(kind="local", model=args.model or DEFAULT_MODEL, **tuning))
    return with_budgets(Policies.single(spec, roster, seed=args.seed), args.max_tokens)


def on_engine(args: argparse.Namespace, policies: Policies) -> Policies:
    """``policies`` on the engine of ``--engine``: as they are for ``local`` (or when no role
    is local: ``--base-url`` names a server already), else every local role on the command's
    vLLM servers (one per base model, shared by all its policy sets, the judge's included),
    started on first use and stopped when the command ends (``args.cleanup``); a pipeline's
    stages use the servers it runs (``$MASCOT_VLLM_SERVERS``)."""
    if getattr(args, "engine", "local") == "local" or all(
            policies.spec(role).kind != "local" for role in ("default", *policies.specs) if role in policies.specs):
        return policies
    from mascot.policies.vllm import VllmPool

    return VllmPool.shared(args, args.cleanup, echo=bool(getattr(args, "verbose", False)),
                           announce=lambda line: err.print(line, markup=False)).serve(policies)


def spec_from_flags(fields: dict[str, object], flag_prefix: str = "--") -> PolicySpec:
    """A policy spec from command-line values.

    Raises:
        UsageError: naming the flag (``flag_prefix`` + the field) of the first bad value.
    """
    from mascot.policies import PolicySpec
    from mascot.rosters.yaml_file import first_error

    try:
        return PolicySpec.model_validate(fields)
    except ValidationError as exc:
        field, problem = first_error(exc)
        raise UsageError(f"{flag_prefix}{field.split('.')[0].replace('_', '-')}: {problem}") from None


def add_judge_flags(parser: argparse.ArgumentParser, *, required: bool) -> None:
    """Add the flags that choose the judge, the same in every command that judges:
    ``--judge-model M [--judge-base-url URL --judge-api-key-env VAR]`` or ``--judge-policies FILE``."""
    group = parser.add_argument_group("judge (one of)")
    choice = group.add_mutually_exclusive_group(required=required)
    choice.add_argument("--judge-model", metavar="HF_ID_OR_PATH",
                        help="judge model: a local model, or a served name with --judge-base-url")
    choice.add_argument("--judge-policies", metavar="FILE", help="policy file whose 'judge' role judges")
    group.add_argument("--judge-base-url", metavar="URL", help="OpenAI-compatible endpoint of --judge-model")
    group.add_argument("--judge-api-key-env", metavar="VAR", help="variable with the judge endpoint's key")


def judge_policies_from_args(args: argparse.Namespace, roster: Roster) -> Policies | None:
    """The policies of the judge flags (``add_judge_flags``), or None when none was given.

    The judge samples at temperature 0 unless its policy file says otherwise.

    Raises:
        UsageError: on a judge flag that needs another, or a bad value (naming the flag).
    """
    from mascot.policies import Policies

    if args.judge_policies:
        if args.judge_base_url or args.judge_api_key_env:
            raise UsageError("--judge-base-url and --judge-api-key-env go with --judge-model, not --judge-policies")
        return Policies.from_file(args.judge_policies, roster, seed=args.seed)
    if not args.judge_model:
        if args.judge_base_url or args.judge_api_key_env:
            raise UsageError("--judge-base-url needs --judge-model NAME (the served judge's name)")
        return None
    if args.judge_api_key_env and not args.judge_base_url:
        raise UsageError("--judge-api-key-env only applies with --judge-base-url")
    kind = "openai" if args.judge_base_url else "local"
    fields: dict[str, object] = {"kind": kind, "model": args.judge_model, "temperature": 0.0}
    if kind == "openai":
        fields.update(base_url=args.judge_base_url, api_key_env=args.judge_api_key_env)
    return Policies({"judge": spec_from_flags(fields, "--judge-")}, roster, seed=args.seed)


def mask_secrets_in_logs(policies: Policies | None = None) -> Redactor:
    """Mask API keys (named by the policies, or secret-looking environment variables)
    in everything logged or printed as an error from now on; return the redactor for
    files too."""
    add_secret_variables(spec.api_key_env for spec in (policies.specs.values() if policies else ())
                         if spec.api_key_env)
    redactor = file_redactor()
    log_filter = RedactingFilter(redactor)
    for handler in logging.getLogger().handlers:
        handler.addFilter(log_filter)
    return redactor


def masked(text: str) -> str:
    """``text`` with the secrets known so far masked (for error lines)."""
    return file_redactor()(text)


def add_recipe_flags(parser: argparse.ArgumentParser, ours: str, trainer: str,
                     recipes: Sequence[tuple[str, str]] = ()) -> None:
    """``--base``, ``--config`` and the settings of ``recipes`` ((module, class) pairs, listed
    with their docs); the command also takes TRL's own flags (see ``recipe_from_args``)."""
    from mascot.cli.recipe_flags import add_recipe_settings

    parser.add_argument("--base", metavar="HF_ID_OR_PATH",
                        help=f"base model (default: the recipe's model_name_or_path, else {DEFAULT_MODEL})")
    parser.add_argument("--config", metavar="RECIPE.yaml",
                        help=f"a flat YAML recipe (or a shipped recipe's name) of {ours}, trl.{trainer} and "
                             f"trl.ModelConfig (LoRA) fields; "
                             f"any of them can also be given as a flag, e.g. --learning_rate 1e-5")
    parser.set_defaults(trainer_flags=[])
    if recipes:
        add_recipe_settings(parser, recipes, f"recipe settings ({ours}; also keys of --config, and every "
                                             f"trl.{trainer} field is a flag too)")


def recipe_from_args(config_class: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """The recipe of a training command (``--config`` and TRL flags, read by TRL's parser)
    and its base model (``--base``, else the recipe's ``model_name_or_path``, else the default).

    Raises:
        UsageError: on a recipe file that is missing or invalid, or a bad flag.
    """
    from mascot.rosters.yaml_file import YamlFileError
    from mascot.training.fitting.recipe import recipe_path

    try:
        recipe = recipe_path(args.config) if args.config else None
    except FileNotFoundError as exc:
        raise UsageError(f"--config: {exc}") from None
    try:
        config, model = config_class.parse(recipe, args.trainer_flags)
    except YamlFileError as exc:  # names the file already
        raise UsageError(f"--config {exc}") from None
    except ValueError as exc:
        raise UsageError(f"{'--config ' + args.config if args.config else 'recipe flags'}: {exc}") from None
    return config, args.base or model or DEFAULT_MODEL


def roster_scenarios(roster: str, command: str) -> list[Scenario]:
    """The scenarios beside a roster, or an error that says where ``command`` looked and what else to do."""
    path = scenario_path(roster_path(roster))
    if not path.is_file():
        raise UsageError(f"no scenario file at {path} ({command} reads scenarios.jsonl beside the roster's "
                         "roster.yaml): write one there, or pass --scenarios FILE.jsonl")
    return load_scenarios(path)


def add_safety_flags(parser: argparse.ArgumentParser) -> None:
    """``--safety-resources`` and ``--no-safety-guard`` (the roster's crisis rules)."""
    parser.add_argument("--safety-resources", action="append", default=[], metavar="[RULE=]TEXT",
                        help="the resource text a safety route gives (a deployment's emergency and crisis "
                             "numbers): for every rule, or RULE=TEXT for one; repeatable")
    parser.add_argument("--no-safety-guard", action="store_true",
                        help="turn the roster's safety rules off (they route crisis rounds by default)")


def safety_from_args(args: argparse.Namespace, roster: Roster) -> Any:
    """The ``safety`` argument of ``create_director_graph`` from the flags: ``False`` with
    ``--no-safety-guard``, else the roster's guard with the given resources.

    Raises:
        UsageError: on a resource text for a rule the roster lacks, or both flags.
    """
    if args.no_safety_guard:
        if args.safety_resources:
            raise UsageError("--safety-resources and --no-safety-guard: choose one")
        return False
    resources: dict[str, str] = {}
    for value in args.safety_resources:
        rule, _, text = value.partition("=")
        if text and rule in {r.name for r in roster.safety}:
            resources[rule] = text.strip()
        elif text and rule.isidentifier() and rule.islower() and " " not in rule:
            raise UsageError(f"--safety-resources: roster '{roster.id}' has no safety rule '{rule}'; valid: "
                             f"{', '.join(r.name for r in roster.safety) or '-'}")
        else:
            resources["*"] = value.strip()
    if any(len(text) < 10 for text in resources.values()):
        raise UsageError("--safety-resources: a resource text needs at least 10 characters")
    if not resources:
        return True
    if not roster.safety:
        raise UsageError(f"--safety-resources: roster '{roster.id}' has no safety rules")
    from mascot.graphs.safety import SafetyGuard

    return SafetyGuard(roster, resources=resources)
