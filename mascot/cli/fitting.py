"""The commands that fit LoRA adapters: ``mascot train-rm``, ``train-sft``, ``train-speakers`` and ``train-director``.

Each reads a recipe with TRL's parser (``--config`` plus TRL flags such as
``--learning_rate 1e-5``). ``train-rm`` saves a reward model under ``--out``; the others
save one PEFT adapter per trained role under ``--out`` with an adapter card and register it
in a policy file, so ``mascot chat --policies FILE`` runs on the new adapters. Run again
after an interruption, they skip the adapters already finished and resume the interrupted
one from its last checkpoint.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from mascot.cli import training_inputs as inputs
from mascot.cli.options import (
    METHOD_HELP,
    ROSTER_HELP,
    UsageError,
    add_recipe_flags,
    err,
    mask_secrets_in_logs,
    on_engine,
    out,
    recipe_from_args,
)
from mascot.cli.training_inputs import SHARED_ADAPTER
from mascot.rosters import Roster, load_roster

#: Where the recipe classes live (their settings are listed in each command's help).
_FITTING = "mascot.training.fitting."
#: Policy file written under ``--out`` when ``--policy-file`` is not given.
POLICY_FILE = "policies.yaml"


def add_commands(commands: argparse._SubParsersAction) -> None:
    """Add ``train-rm``, ``train-sft``, ``train-speakers`` and ``train-director`` to the command line."""
    train_rm = commands.add_parser("train-rm", help="train a LoRA reward model on preference pairs")
    train_rm.add_argument("--pairs", required=True, metavar="DIR", help="folder from mascot pairs")
    add_recipe_flags(train_rm, "RewardModelConfig", "RewardConfig", [(_FITTING + "reward_model", "RewardModelConfig")])
    train_rm.add_argument("--out", required=True, metavar="DIR", help="folder of the reward model")
    train_rm.set_defaults(run=_train_rm, allocator="train")

    sft = commands.add_parser(
        "train-sft", help="fit the warm start (SFT, LoRA) on the best-judged replies and directions")
    sft.add_argument("--roster", required=True, metavar="ID_OR_PATH", help=ROSTER_HELP)
    sft.add_argument("--pairs", metavar="DIR", help="persona pairs (mascot pairs): the speakers' adapter "
                                                    f"'{SHARED_ADAPTER}' learns each context's best winner")
    sft.add_argument("--group-pairs", metavar="DIR", help="group pairs of sibling blocks: the Director's adapter "
                                                          "learns each decision point's best direction")
    sft.add_argument("--blocks", metavar="FILE", help="the sibling blocks of --group-pairs (mascot blocks)")
    sft.add_argument("--episodes", metavar="FILE", help="the episodes the blocks were played from (the "
                                                        "Director's prompts)")
    sft.add_argument("--samples", metavar="FILE", help="rejection-sampled data (mascot samples): both adapters "
                                                       "learn the samples that passed the checks")
    sft.add_argument("--keep", type=int, default=2, metavar="N",
                     help="with --samples: distinct passing samples per context at most (default 2)")
    _add_common(sft, "WarmStartConfig", "SFTConfig", [(_FITTING + "warm_start", "WarmStartConfig")])
    sft.set_defaults(run=_train_sft, allocator="train")

    speakers = commands.add_parser(
        "train-speakers", help="fit a LoRA adapter per persona: GRPO on a persona RM, or DPO on pairs")
    speakers.add_argument("--roster", required=True, metavar="ID_OR_PATH", help=ROSTER_HELP)
    speakers.add_argument("--method", choices=("grpo", "dpo"), default="grpo", help=METHOD_HELP)
    speakers.add_argument("--episodes", metavar="FILE", help="episodes whose persona turns are the prompts (grpo)")
    speakers.add_argument("--rm", metavar="PERSONA_RM_DIR", help="persona reward model from train-rm (grpo)")
    speakers.add_argument("--pairs", metavar="DIR_OR_FILE", help="preference pairs from mascot pairs (dpo)")
    speakers.add_argument("--personas", metavar="A,B", help="persona ids to train (default: every persona)")
    speakers.add_argument("--shared", action="store_true",
                          help=f"one adapter '{SHARED_ADAPTER}' for every persona instead of one each")
    _add_common(speakers, "SpeakerTrainingConfig (grpo) or SpeakerDPOConfig (dpo)", "GRPOConfig or DPOConfig",
                [(_FITTING + "speaker_training", "SpeakerTrainingConfig"),
                 (_FITTING + "speaker_dpo", "SpeakerDPOConfig")])
    # GRPO samples in this process; DPO only runs forward and backward passes (mascot.policies.allocator)
    speakers.set_defaults(run=_train_speakers, allocator=lambda args: "generate" if args.method == "grpo" else "train")

    director = commands.add_parser(
        "train-director", help="fit the Director's LoRA adapter: GRPO on rolled-out blocks, or DPO on pairs")
    director.add_argument("--roster", required=True, metavar="ID_OR_PATH", help=ROSTER_HELP)
    director.add_argument("--method", choices=("grpo", "dpo"), default="grpo", help=METHOD_HELP)
    director.add_argument("--episodes", metavar="FILE",
                          help="episodes whose Director decision points are the prompts (grpo)")
    director.add_argument("--group-rm", metavar="GROUP_RM_DIR", help="group reward model from train-rm (grpo)")
    director.add_argument("--speakers", metavar="POLICIES",
                          help="policy file of the speakers (and the user simulator) that play the blocks (grpo)")
    director.add_argument("--pairs", metavar="DIR_OR_FILE",
                          help="Director preference pairs (dpo): mascot pairs --samples or --approvals")
    director.add_argument("--block-turns", type=int, metavar="N", help="turns played per sampled direction")
    director.add_argument("--engine", choices=("local", "vllm"), default="local",
                          help="what plays the blocks' speakers and user: in process (local), or vLLM servers "
                               "started for the command (or the pipeline's); the Director trains in process")
    _add_common(director, "DirectorTrainingConfig (grpo) or SpeakerDPOConfig (dpo)", "GRPOConfig or DPOConfig",
                [(_FITTING + "director_training", "DirectorTrainingConfig"),
                 (_FITTING + "speaker_dpo", "SpeakerDPOConfig")])
    # freed pages given back after 10 s even when the server samples: a Director GRPO trainer
    # that kept them all grew to 18 GiB in 7 steps of the 0.5B model and was killed (2 cores, 24 GiB)
    director.set_defaults(run=_train_director, allocator="generate")


def _add_common(parser: argparse.ArgumentParser, ours: str, trainer: str, recipes: list[tuple[str, str]]) -> None:
    parser.add_argument("--out", required=True, metavar="DIR", help="folder of the adapters")
    parser.add_argument("--policy-file", metavar="FILE",
                        help=f"policy file to register the adapters in (default OUT/{POLICY_FILE}; "
                             "train-director: the --speakers file)")
    parser.add_argument("--retrain", action="store_true", help="train again adapters that are already finished")
    add_recipe_flags(parser, ours, trainer, recipes)


def _fit_adapter(args: argparse.Namespace, name: str, *, roles: list[str], policy_file: Path, base: str,
                 roster: Roster, train: Callable[[], bool | None], errors: tuple[type[Exception], ...] = ()) -> None:
    """One adapter's life cycle, the same in every training command: its folder under
    ``--out``, skipped when finished unless ``--retrain``, else ``train()`` (which returns
    ``False`` when it trained nothing and the adapter is not to be registered), then
    registered for ``roles`` in ``policy_file`` by the process that writes files. ``errors``
    (with a bad folder and ``ValueError``) become one usage line naming the adapter."""
    from mascot.training.fitting.adapter_folder import AdapterFolderError, adapter_target, is_finished
    from mascot.training.fitting.adapter_registry import register_adapter

    try:
        target = adapter_target(args.out, name)
        if is_finished(target) and not args.retrain:
            err.print(f"{name}: already trained in {target} (--retrain to train again)", markup=False)
        elif train() is False:
            return
    except (AdapterFolderError, ValueError, *errors) as exc:
        raise UsageError(f"{name}: {exc}") from None
    if _main_process():
        for role in roles:
            register_adapter(policy_file, role, base=base, adapter=target, roster=roster)


def _train_speakers(args: argparse.Namespace) -> int:
    roster = load_roster(args.roster)
    args.allocate()  # the recipe's checks need the trainers' stack
    from mascot.training.fitting.reward_model import RewardModel, RewardModelError
    from mascot.training.fitting.speaker_dpo import SpeakerDPOConfig, SpeakerDPOError
    from mascot.training.fitting.speaker_training import SpeakerTrainingConfig, SpeakerTrainingError

    config, base = recipe_from_args(SpeakerDPOConfig if args.method == "dpo" else SpeakerTrainingConfig, args)
    personas = inputs.personas(args.personas.split(",") if args.personas else config.personas, roster)
    shared = args.shared or not config.per_persona
    policy_file = Path(args.policy_file or Path(args.out) / POLICY_FILE)
    rows: list[dict[str, Any]] = []
    episodes: list[Any] = []
    if args.method == "dpo":
        rows = inputs.pairs(args.pairs)
        source, reward_model = str(args.pairs), None
    else:
        if not args.episodes:
            raise UsageError("--method grpo needs --episodes FILE (the persona turns are its prompts)")
        episodes = inputs.episodes(args.episodes, roster)
        source, reward_model = args.episodes, None
        if config.rm_weight:
            if not args.rm:
                raise UsageError("GRPO needs a persona reward model: --rm DIR (or rm_weight: 0 in the recipe)")
            try:
                reward_model = RewardModel.load(args.rm).reward_function()
            except RewardModelError as exc:
                raise UsageError(f"--rm: {exc}") from None
    jobs = [(SHARED_ADAPTER, None)] if shared else [(p, p) for p in personas]
    for name, persona in jobs:
        if args.method == "dpo":
            mine = [r for r in rows
                    if (r.get("persona") in personas if persona is None else r.get("persona") == persona)]
            train = partial(_speaker_dpo, args, name, mine, base, config, source)
        else:
            train = partial(_speaker_grpo, args, name, persona, episodes, roster, personas, base, config, source,
                            reward_model)
        _fit_adapter(args, name, roles=personas if persona is None else [persona], policy_file=policy_file, base=base,
                     roster=roster, train=train, errors=(SpeakerTrainingError, SpeakerDPOError))
    out.print(f"train-speakers: policy file {policy_file} (mascot chat --roster {roster.id} "
              f"--policies {policy_file})", markup=False)
    return 0


def _speaker_dpo(args: argparse.Namespace, name: str, rows: list[dict[str, Any]], base: str, config: Any,
                 source: str, *, command: str = "train-speakers") -> None:
    """DPO of one adapter on its role's pairs (``train-speakers`` and ``train-director --method dpo``)."""
    from mascot.training.fitting.speaker_dpo import train_speaker_dpo

    if not rows:
        raise UsageError(f"--pairs: no pairs of persona '{name}' in {args.pairs}")
    err.print(f"{name}: DPO on {len(rows)} pairs from {base}", markup=False)
    report = train_speaker_dpo(rows, base=base, persona=name, out=args.out, config=config, data=source)
    out.print(f"{command}: {name} -> {report.out} (dpo, {report.steps} steps, "
              f"loss {report.train_loss:.3f}, {report.seconds:.0f} s)", markup=False)


def _speaker_grpo(args: argparse.Namespace, name: str, persona: str | None, episodes: list[Any], roster: Roster,
                  personas: list[str], base: str, config: Any, source: str, reward_model: Any) -> bool | None:
    """``train-speakers --method grpo``: one adapter fitted on its personas' turns; ``False``
    (not trained, not registered) for a persona with no directed turn that was not asked for."""
    from mascot.training.fitting.speaker_training import speaker_prompts, train_speaker

    if persona is not None and not inputs.has_turns(episodes, persona) and not args.personas:
        err.print(f"{name}: no turn with a stage direction in {args.episodes}; not trained", markup=False)
        return False
    dataset = speaker_prompts(episodes, roster, persona)
    if persona is None:
        dataset = dataset.filter(lambda row: row["persona"] in personas)
    terms = config.reward_terms(roster, persona, reward_model=reward_model)
    err.print(f"{name}: GRPO on {len(dataset)} prompts from {base}", markup=False)
    report = train_speaker(dataset, base=base, persona=name, out=args.out, reward_funcs=terms, config=config,
                           data=source)
    out.print(f"train-speakers: {name} -> {report.out} (grpo, {report.steps} steps, reward "
              f"{_number(report.reward_first)} -> {_number(report.reward_last)}, {report.seconds:.0f} s)",
              markup=False)
    return None


def _train_director(args: argparse.Namespace) -> int:
    roster = load_roster(args.roster)
    if args.method == "dpo":
        return _train_director_dpo(args, roster)
    if not args.episodes or not args.speakers:
        raise UsageError("--method grpo needs --episodes FILE and --speakers POLICIES")
    args.allocate()  # the recipe's checks need the trainers' stack
    from mascot.policies import Policies
    from mascot.training.data.block_rollout import decision_points
    from mascot.training.fitting.director_training import DirectorTrainingConfig
    from mascot.training.fitting.reward_model import RewardModel, RewardModelError

    config, base = recipe_from_args(DirectorTrainingConfig, args)
    if args.block_turns is not None:
        if args.block_turns < 1:
            raise UsageError(f"--block-turns must be at least 1, got {args.block_turns}")
        config.block_turns = args.block_turns
    if not Path(args.speakers).is_file():
        raise UsageError(f"--speakers: no such file {args.speakers}")
    policy_file = Path(args.policy_file or args.speakers)
    points = decision_points(inputs.episodes(args.episodes, roster), roster,
                             max_speakers_per_round=config.max_speakers_per_round,
                             min_speakers_per_round=config.min_speakers_per_round)
    if not points:
        raise UsageError(f"--episodes: no Director decision points in {args.episodes}")
    group_rm = None
    if config.group_rm_weight:
        if not args.group_rm:
            raise UsageError("Director GRPO needs a group reward model: --group-rm DIR (or group_rm_weight: 0)")
        try:
            group_rm = RewardModel.load(args.group_rm)
        except RewardModelError as exc:
            raise UsageError(f"--group-rm: {exc}") from None
    policies = on_engine(args, Policies.from_file(args.speakers, roster))
    mask_secrets_in_logs(policies)
    _fit_adapter(args, "director", roles=["director"], policy_file=policy_file, base=base, roster=roster,
                 train=partial(_director_grpo, args, points, policies, roster, base, config, group_rm))
    out.print(f"train-director: policy file {policy_file} (mascot chat --roster {roster.id} "
              f"--policies {policy_file})", markup=False)
    return 0


def _director_grpo(args: argparse.Namespace, points: list[Any], policies: Any, roster: Roster, base: str,
                   config: Any, group_rm: Any) -> None:
    """``train-director --method grpo``: the Director's adapter fitted on its decision points,
    each sampled direction played for a block (on the vLLM servers when ``--engine vllm``)."""
    from mascot.training.data.block_rollout import BlockRollout
    from mascot.training.fitting.director_training import train_director

    rollout = BlockRollout(roster, speakers=policies.speakers(), director=policies.chat_model("director"),
                           user=policies.chat_model("user"), block_turns=config.block_turns,
                           max_speakers_per_round=config.max_speakers_per_round,
                           min_speakers_per_round=config.min_speakers_per_round,
                           concurrency=config.rollout_concurrency)
    rollout_func = None
    pool = getattr(args, "vllm_pool", None)
    if pool is not None:  # the directions are sampled on the server too, with their blocks
        from mascot.policies.vllm import load_adapters
        from mascot.training.fitting.director_rollout import DirectorRollout

        url = pool.url(base)
        rollout_func = DirectorRollout(points, rollout, url=url, served_name=pool.served_name(url, base),
                                       adapters_dir=Path(args.out) / "checkpoints" / "director-served",
                                       concurrency=config.rollout_concurrency,
                                       load=lambda url, adapters: load_adapters(
                                           url, adapters, allowed=pool.allowed_modules(url)))
    err.print(f"director: GRPO on {len(points)} decision points from {base}, "
              f"{config.block_turns} turns per block, directions sampled "
              f"{'on the vLLM server' if rollout_func else 'in process'}", markup=False)
    try:
        report = train_director(points, base=base, out=args.out, rollout=rollout, group_rm=group_rm,
                                config=config, data=args.episodes, rollout_func=rollout_func)
    finally:
        rollout.close()
    out.print(f"train-director: director -> {report.out} ({report.steps} steps, reward "
              f"{_number(report.reward_first)} -> {_number(report.reward_last)}, {report.seconds:.0f} s)",
              markup=False)


def _train_sft(args: argparse.Namespace) -> int:
    roster = load_roster(args.roster)
    if args.samples and (args.pairs or args.group_pairs):
        raise UsageError("use either --samples or --pairs/--group-pairs, not both")
    if not args.pairs and not args.group_pairs and not args.samples:
        raise UsageError("give --samples (both adapters), or --pairs (the speakers' warm start), --group-pairs "
                         "(the Director's) or both")
    if args.keep < 1:
        raise UsageError(f"--keep {args.keep}: must be at least 1")
    if args.group_pairs and not (args.blocks and args.episodes):
        raise UsageError("--group-pairs needs --blocks FILE and --episodes FILE (the directions and their prompts)")
    # a missing file is said before the trainers' stack loads (seconds of imports)
    for flag, where in (("--samples", args.samples), ("--blocks", args.blocks), ("--episodes", args.episodes)):
        if where and not Path(where).is_file():
            raise UsageError(f"{flag}: no such file {where}")
    for flag, where in (("--pairs", args.pairs), ("--group-pairs", args.group_pairs)):
        if where and not inputs.pairs_file(where).is_file():
            raise UsageError(f"{flag}: no such file {inputs.pairs_file(where)}")
    args.allocate()
    from mascot.training.fitting.warm_start import WarmStartConfig, WarmStartError, director_rows, speaker_rows

    config, base = recipe_from_args(WarmStartConfig, args)
    policy_file = Path(args.policy_file or Path(args.out) / POLICY_FILE)
    jobs = []
    if args.samples:
        jobs += inputs.sample_jobs(args.samples, args.keep, roster)
    if args.pairs:
        found = speaker_rows(inputs.pairs(args.pairs, "--pairs"))
        jobs.append((SHARED_ADAPTER, found, list(roster.persona_ids), args.pairs))
    if args.group_pairs:
        found = director_rows(inputs.pairs(args.group_pairs, "--group-pairs"), inputs.blocks(args.blocks),
                              inputs.director_prompts(args.episodes, roster))
        jobs.append(("director", found, ["director"], args.group_pairs))
    for name, found, roles, source in jobs:
        left = ", ".join(f"{n} {k}" for k, n in sorted(found.faults.items())) or "none"
        what = (f"{len(found.rows)} passing samples of {found.contexts} contexts" if source == args.samples
                else f"{len(found.rows)} of {found.contexts} contexts' best winners")
        err.print(f"{name}: SFT on {what} from {base} (left out: faults {left}; invalid directions {found.invalid})",
                  markup=False)
        _fit_adapter(args, name, roles=roles, policy_file=policy_file, base=base, roster=roster,
                     train=partial(_warm_start, args, name, found, base, config, source), errors=(WarmStartError,))
    out.print(f"train-sft: policy file {policy_file} (the candidate sampler: mascot candidates --policies "
              f"{policy_file}; GRPO from it: --init_adapter {Path(args.out) / SHARED_ADAPTER})", markup=False)
    return 0


def _warm_start(args: argparse.Namespace, name: str, found: Any, base: str, config: Any, source: str) -> None:
    """``train-sft``: one adapter fitted on its rows."""
    from mascot.training.fitting.warm_start import train_warm_start

    run = train_warm_start(found.rows, base=base, name=name, out=args.out, config=config, data=source)
    out.print(f"train-sft: {name} -> {run.out} ({run.data_size} rows, {run.steps} steps, token "
              f"accuracy {_number(run.reward_first)} -> {_number(run.reward_last)}, loss "
              f"{run.train_loss:.3f}, {run.seconds:.0f} s)", markup=False)


def _train_director_dpo(args: argparse.Namespace, roster: Roster) -> int:
    """``train-director --method dpo``: the Director's adapter fitted on its preference pairs."""
    if not args.pairs:
        raise UsageError("--method dpo needs --pairs DIR (mascot pairs --samples or --approvals)")
    rows = [r for r in inputs.pairs(args.pairs) if r.get("persona") == "director"]
    args.allocate()
    from mascot.training.fitting.adapter_registry import register_adapter
    from mascot.training.fitting.speaker_dpo import SpeakerDPOConfig, SpeakerDPOError

    config, base = recipe_from_args(SpeakerDPOConfig, args)
    policy_file = Path(args.policy_file or Path(args.out) / POLICY_FILE)
    if not rows:  # as train-speakers does with a persona that has no turn: said, and left as it was
        if config.init_adapter and _main_process():
            register_adapter(policy_file, "director", base=base, adapter=config.init_adapter, roster=roster)
        kept = f"; {config.init_adapter} is kept as the Director's adapter" if config.init_adapter else ""
        err.print(f"director: no Director pairs (persona 'director') in {args.pairs}; not trained{kept}",
                  markup=False)
        return 0
    _fit_adapter(args, "director", roles=["director"], policy_file=policy_file, base=base, roster=roster,
                 train=partial(_speaker_dpo, args, "director", rows, base, config, str(args.pairs),
                               command="train-director"), errors=(SpeakerDPOError,))
    out.print(f"train-director: policy file {policy_file}", markup=False)
    return 0


def _main_process() -> bool:
    """Whether this is the process that writes files (the only one, or rank 0 under
    ``accelerate launch``)."""
    from accelerate import PartialState

    return PartialState().is_main_process


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _train_rm(args: argparse.Namespace) -> int:
    folder = Path(args.pairs)
    if not (folder / "train.jsonl").is_file():
        raise UsageError(f"--pairs: no train.jsonl in {folder} (make it with `mascot pairs`)")
    args.allocate()
    from mascot.training.data.pairs import read_pairs
    from mascot.training.fitting.reward_model import RewardModelConfig, RewardModelError, train_reward_model

    train = read_pairs(folder / "train.jsonl")
    test = read_pairs(folder / "test.jsonl") if (folder / "test.jsonl").is_file() else []
    config, base = recipe_from_args(RewardModelConfig, args)
    err.print(f"training a reward model on {len(train)} pairs ({len(test)} held out) from {base}", markup=False)
    try:
        report = train_reward_model(train, test, base=base, out=args.out, config=config)
    except RewardModelError as exc:  # torch is imported only here, so the error class too
        raise UsageError(str(exc)) from None
    accuracy = (f"held-out pairwise accuracy {report.accuracy_before:.2f} -> {report.accuracy_after:.2f}"
                if report.accuracy_after is not None else "no held-out pairs")
    out.print(f"train-rm: {report.out}: {accuracy}, {report.steps} steps, loss {report.train_loss:.3f}, "
              f"{report.seconds:.0f} s", markup=False)
    return 0
