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
from pathlib import Path
from typing import Any

from mascot.cli.options import (
    UsageError,
    add_recipe_flags,
    err,
    mask_secrets_in_logs,
    on_engine,
    out,
    recipe_from_args,
)
from mascot.rosters import Roster, load_roster

#: Policy file written under ``--out`` when ``--policy-file`` is not given.
POLICY_FILE = "policies.yaml"
#: Adapter name of one adapter shared by every persona.
SHARED_ADAPTER = "speakers"


def add_commands(commands: argparse._SubParsersAction) -> None:
    """Add ``train-rm``, ``train-sft``, ``train-speakers`` and ``train-director`` to the command line."""
    train_rm = commands.add_parser("train-rm", help="train a LoRA reward model on preference pairs")
    train_rm.add_argument("--pairs", required=True, metavar="DIR", help="folder from mascot pairs")
    add_recipe_flags(train_rm, "RewardModelConfig", "RewardConfig")
    train_rm.add_argument("--out", required=True, metavar="DIR")
    train_rm.set_defaults(run=_train_rm, allocator="train")

    sft = commands.add_parser(
        "train-sft", help="fit the warm start (SFT, LoRA) on the best-judged replies and directions")
    sft.add_argument("--roster", required=True, metavar="ID_OR_PATH")
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
    _add_common(sft, "WarmStartConfig", "SFTConfig")
    sft.set_defaults(run=_train_sft, allocator="train")

    speakers = commands.add_parser(
        "train-speakers", help="fit a LoRA adapter per persona: GRPO on a persona RM, or DPO on pairs")
    speakers.add_argument("--roster", required=True, metavar="ID_OR_PATH")
    speakers.add_argument("--method", choices=("grpo", "dpo"), default="grpo")
    speakers.add_argument("--episodes", metavar="FILE", help="episodes whose persona turns are the prompts (grpo)")
    speakers.add_argument("--rm", metavar="PERSONA_RM_DIR", help="persona reward model from train-rm (grpo)")
    speakers.add_argument("--pairs", metavar="DIR_OR_FILE", help="preference pairs from mascot pairs (dpo)")
    speakers.add_argument("--personas", metavar="A,B", help="persona ids to train (default: every persona)")
    speakers.add_argument("--shared", action="store_true",
                          help=f"one adapter '{SHARED_ADAPTER}' for every persona instead of one each")
    _add_common(speakers, "SpeakerTrainingConfig (grpo) or SpeakerDPOConfig (dpo)", "GRPOConfig or DPOConfig")
    # GRPO samples in this process; DPO only runs forward and backward passes (mascot.policies.allocator)
    speakers.set_defaults(run=_train_speakers, allocator=lambda args: "generate" if args.method == "grpo" else "train")

    director = commands.add_parser(
        "train-director", help="fit the Director's LoRA adapter: GRPO on rolled-out blocks, or DPO on pairs")
    director.add_argument("--roster", required=True, metavar="ID_OR_PATH")
    director.add_argument("--method", choices=("grpo", "dpo"), default="grpo")
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
    _add_common(director, "DirectorTrainingConfig (grpo) or SpeakerDPOConfig (dpo)", "GRPOConfig or DPOConfig")
    # freed pages given back after 10 s even when the server samples: a Director GRPO trainer
    # that kept them all grew to 18 GiB in 7 steps of the 0.5B model and was killed (2 cores, 24 GiB)
    director.set_defaults(run=_train_director, allocator="generate")


def _add_common(parser: argparse.ArgumentParser, ours: str, trainer: str) -> None:
    parser.add_argument("--out", required=True, metavar="DIR", help="folder of the adapters")
    parser.add_argument("--policy-file", metavar="FILE",
                        help=f"policy file to register the adapters in (default OUT/{POLICY_FILE}; "
                             "train-director: the --speakers file)")
    parser.add_argument("--retrain", action="store_true", help="train again adapters that are already finished")
    add_recipe_flags(parser, ours, trainer)


def _train_speakers(args: argparse.Namespace) -> int:
    from mascot.training.fitting.adapter_folder import AdapterFolderError, adapter_target, is_finished
    from mascot.training.fitting.adapter_registry import register_adapter
    from mascot.training.fitting.reward_model import RewardModel, RewardModelError
    from mascot.training.fitting.speaker_dpo import SpeakerDPOConfig, SpeakerDPOError, train_speaker_dpo
    from mascot.training.fitting.speaker_training import (
        SpeakerTrainingConfig,
        SpeakerTrainingError,
        speaker_prompts,
        train_speaker,
    )

    roster = load_roster(args.roster)
    config, base = recipe_from_args(SpeakerDPOConfig if args.method == "dpo" else SpeakerTrainingConfig, args)
    personas = _personas(args.personas.split(",") if args.personas else config.personas, roster)
    shared = args.shared or not config.per_persona
    policy_file = Path(args.policy_file or Path(args.out) / POLICY_FILE)
    if args.method == "dpo":
        rows = _pairs(args.pairs)
        source, reward_model = str(args.pairs), None
    else:
        if not args.episodes:
            raise UsageError("--method grpo needs --episodes FILE (the persona turns are its prompts)")
        episodes = _episodes(args.episodes, roster)
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
        try:
            target = adapter_target(args.out, name)
            if is_finished(target) and not args.retrain:
                err.print(f"{name}: already trained in {target} (--retrain to train again)", markup=False)
            elif args.method == "dpo":
                mine = [r for r in rows
                        if (r.get("persona") in personas if persona is None else r.get("persona") == persona)]
                if not mine:
                    raise UsageError(f"--pairs: no pairs of persona '{name}' in {args.pairs}")
                err.print(f"{name}: DPO on {len(mine)} pairs from {base}", markup=False)
                report = train_speaker_dpo(mine, base=base, persona=name, out=args.out, config=config, data=source)
                out.print(f"train-speakers: {name} -> {report.out} (dpo, {report.steps} steps, "
                          f"loss {report.train_loss:.3f}, {report.seconds:.0f} s)", markup=False)
            else:
                if persona is not None and not _has_turns(episodes, persona) and not args.personas:
                    err.print(f"{name}: no turn with a stage direction in {args.episodes}; not trained",
                              markup=False)
                    continue
                dataset = speaker_prompts(episodes, roster, persona)
                if persona is None:
                    dataset = dataset.filter(lambda row: row["persona"] in personas)
                terms = config.reward_terms(roster, persona, reward_model=reward_model)
                err.print(f"{name}: GRPO on {len(dataset)} prompts from {base}", markup=False)
                report = train_speaker(dataset, base=base, persona=name, out=args.out, reward_funcs=terms,
                                       config=config, data=source)
                out.print(f"train-speakers: {name} -> {report.out} (grpo, {report.steps} steps, reward "
                          f"{_number(report.reward_first)} -> {_number(report.reward_last)}, "
                          f"{report.seconds:.0f} s)", markup=False)
        except (AdapterFolderError, SpeakerTrainingError, SpeakerDPOError, ValueError) as exc:
            raise UsageError(f"{name}: {exc}") from None
        if _main_process():
            for role in personas if persona is None else [persona]:
                register_adapter(policy_file, role, base=base, adapter=target, roster=roster)
    out.print(f"train-speakers: policy file {policy_file} (mascot chat --roster {roster.id} "
              f"--policies {policy_file})", markup=False)
    return 0


def _train_director(args: argparse.Namespace) -> int:
    from mascot.policies import Policies
    from mascot.training.data.block_rollout import BlockRollout, decision_points
    from mascot.training.fitting.adapter_folder import AdapterFolderError, adapter_target, is_finished
    from mascot.training.fitting.adapter_registry import register_adapter
    from mascot.training.fitting.director_training import DirectorTrainingConfig, train_director
    from mascot.training.fitting.reward_model import RewardModel, RewardModelError

    roster = load_roster(args.roster)
    if args.method == "dpo":
        return _train_director_dpo(args, roster)
    if not args.episodes or not args.speakers:
        raise UsageError("--method grpo needs --episodes FILE and --speakers POLICIES")
    config, base = recipe_from_args(DirectorTrainingConfig, args)
    if args.block_turns is not None:
        if args.block_turns < 1:
            raise UsageError(f"--block-turns must be at least 1, got {args.block_turns}")
        config.block_turns = args.block_turns
    if not Path(args.speakers).is_file():
        raise UsageError(f"--speakers: no such file {args.speakers}")
    policy_file = Path(args.policy_file or args.speakers)
    points = decision_points(_episodes(args.episodes, roster), roster,
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
    try:
        target = adapter_target(args.out, "director")
    except AdapterFolderError as exc:
        raise UsageError(str(exc)) from None
    if is_finished(target) and not args.retrain:
        err.print(f"director: already trained in {target} (--retrain to train again)", markup=False)
    else:
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
        except (AdapterFolderError, ValueError) as exc:
            raise UsageError(f"director: {exc}") from None
        finally:
            rollout.close()
        out.print(f"train-director: director -> {report.out} ({report.steps} steps, reward "
                  f"{_number(report.reward_first)} -> {_number(report.reward_last)}, {report.seconds:.0f} s)",
                  markup=False)
    if _main_process():
        register_adapter(policy_file, "director", base=base, adapter=target, roster=roster)
    out.print(f"train-director: policy file {policy_file} (mascot chat --roster {roster.id} "
              f"--policies {policy_file})", markup=False)
    return 0


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
        if where and not _pairs_file(where).is_file():
            raise UsageError(f"{flag}: no such file {_pairs_file(where)}")
    from mascot.training.fitting.adapter_folder import AdapterFolderError, adapter_target, is_finished
    from mascot.training.fitting.adapter_registry import register_adapter
    from mascot.training.fitting.warm_start import (
        WarmStartConfig,
        WarmStartError,
        director_rows,
        speaker_rows,
        train_warm_start,
    )

    config, base = recipe_from_args(WarmStartConfig, args)
    policy_file = Path(args.policy_file or Path(args.out) / POLICY_FILE)
    jobs = []
    if args.samples:
        jobs += _sample_jobs(args.samples, args.keep, roster)
    if args.pairs:
        found = speaker_rows(_pairs(args.pairs, "--pairs"))
        jobs.append((SHARED_ADAPTER, found, list(roster.persona_ids), args.pairs))
    if args.group_pairs:
        found = director_rows(_pairs(args.group_pairs, "--group-pairs"), _blocks(args.blocks),
                              _director_prompts(args.episodes, roster))
        jobs.append(("director", found, ["director"], args.group_pairs))
    for name, found, roles, source in jobs:
        left = ", ".join(f"{n} {k}" for k, n in sorted(found.faults.items())) or "none"
        what = (f"{len(found.rows)} passing samples of {found.contexts} contexts" if source == args.samples
                else f"{len(found.rows)} of {found.contexts} contexts' best winners")
        err.print(f"{name}: SFT on {what} from {base} (left out: faults {left}; invalid directions {found.invalid})",
                  markup=False)
        try:
            target = adapter_target(args.out, name)
            if is_finished(target) and not args.retrain:
                err.print(f"{name}: already trained in {target} (--retrain to train again)", markup=False)
            else:
                run = train_warm_start(found.rows, base=base, name=name, out=args.out, config=config, data=source)
                out.print(f"train-sft: {name} -> {run.out} ({run.data_size} rows, {run.steps} steps, token "
                          f"accuracy {_number(run.reward_first)} -> {_number(run.reward_last)}, loss "
                          f"{run.train_loss:.3f}, {run.seconds:.0f} s)", markup=False)
        except (AdapterFolderError, WarmStartError, ValueError) as exc:
            raise UsageError(f"{name}: {exc}") from None
        if _main_process():
            for role in roles:
                register_adapter(policy_file, role, base=base, adapter=target, roster=roster)
    out.print(f"train-sft: policy file {policy_file} (the candidate sampler: mascot candidates --policies "
              f"{policy_file}; GRPO from it: --init_adapter {Path(args.out) / SHARED_ADAPTER})", markup=False)
    return 0


def _train_director_dpo(args: argparse.Namespace, roster: Roster) -> int:
    """``train-director --method dpo``: the Director's adapter fitted on its preference pairs."""
    from mascot.training.fitting.adapter_folder import AdapterFolderError, adapter_target, is_finished
    from mascot.training.fitting.adapter_registry import register_adapter
    from mascot.training.fitting.speaker_dpo import SpeakerDPOConfig, SpeakerDPOError, train_speaker_dpo

    if not args.pairs:
        raise UsageError("--method dpo needs --pairs DIR (mascot pairs --samples or --approvals)")
    rows = [r for r in _pairs(args.pairs) if r.get("persona") == "director"]
    config, base = recipe_from_args(SpeakerDPOConfig, args)
    policy_file = Path(args.policy_file or Path(args.out) / POLICY_FILE)
    if not rows:  # as train-speakers does with a persona that has no turn: said, and left as it was
        if config.init_adapter and _main_process():
            register_adapter(policy_file, "director", base=base, adapter=config.init_adapter, roster=roster)
        kept = f"; {config.init_adapter} is kept as the Director's adapter" if config.init_adapter else ""
        err.print(f"director: no Director pairs (persona 'director') in {args.pairs}; not trained{kept}",
                  markup=False)
        return 0
    try:
        target = adapter_target(args.out, "director")
        if is_finished(target) and not args.retrain:
            err.print(f"director: already trained in {target} (--retrain to train again)", markup=False)
        else:
            err.print(f"director: DPO on {len(rows)} pairs from {base}", markup=False)
            report = train_speaker_dpo(rows, base=base, persona="director", out=args.out, config=config,
                                       data=str(args.pairs))
            out.print(f"train-director: director -> {report.out} (dpo, {report.steps} steps, loss "
                      f"{report.train_loss:.3f}, {report.seconds:.0f} s)", markup=False)
    except (AdapterFolderError, SpeakerDPOError, ValueError) as exc:
        raise UsageError(f"director: {exc}") from None
    if _main_process():
        register_adapter(policy_file, "director", base=base, adapter=target, roster=roster)
    out.print(f"train-director: policy file {policy_file}", markup=False)
    return 0


def _sample_jobs(path: str, keep: int, roster: Roster) -> list[tuple[str, Any, list[str], str]]:
    """The warm-start jobs of a samples file (``_train_sft`` checked it exists): the speakers'
    and the Director's rows that passed."""
    from mascot.training.data.selection import select_rows
    from mascot.training.data.warm_start_samples import sample_counts
    from mascot.training.fitting.warm_start import WarmStartRows

    rows = select_rows(path, roster, keep=keep)  # the best of each context by the measured outcomes
    counts = sample_counts(path)
    jobs = []
    for name, role, roles in ((SHARED_ADAPTER, "speakers", list(roster.persona_ids)),
                              ("director", "director", ["director"])):
        faults: dict[str, int] = {}
        for key, row in counts.items():
            if key.endswith(f"/{role}"):
                for fault, n in row.items():
                    if fault not in ("sampled", "passed"):
                        faults[fault] = faults.get(fault, 0) + n
        if rows[role]:
            contexts = len({r["context_id"] for r in rows[role]})
            jobs.append((name, WarmStartRows(rows=rows[role], contexts=contexts, faults=faults), roles, path))
    if not jobs:
        raise UsageError(f"--samples: no sample in {path} passed the checks")
    return jobs


def _blocks(path: str) -> list[Any]:
    """The sibling blocks of ``--blocks`` (``_train_sft`` checked the file exists)."""
    from mascot.training.data.sibling_blocks import SiblingBlockError, read_block_candidates

    try:
        return read_block_candidates(path)
    except SiblingBlockError as exc:
        raise UsageError(f"--blocks: {exc}") from None


def _director_prompts(path: str, roster: Roster) -> dict[str, Any]:
    from mascot.training.data.block_rollout import decision_points

    return {p.context_id: p.prompt for p in decision_points(_episodes(path, roster), roster)}


def _has_turns(episodes: list[Any], persona: str) -> bool:
    return any(m.name == persona and m.stage_direction for e in episodes for m in e.messages)


def _personas(ids: list[str], roster: Roster) -> list[str]:
    unknown = [i for i in ids if i not in roster.persona_ids]
    if unknown:
        raise UsageError(f"--personas: unknown persona(s) {', '.join(unknown)}; valid: {', '.join(roster.persona_ids)}")
    return list(ids) or list(roster.persona_ids)


def _episodes(path: str, roster: Roster | None = None) -> list[Any]:
    from mascot.training.episodes.episode import read_episodes

    if not Path(path).is_file():
        raise UsageError(f"--episodes: no such file {path}")
    episodes = read_episodes(path)
    if not episodes:
        raise UsageError(f"--episodes: no episodes in {path}")
    others = sorted({e.roster for e in episodes} - {roster.id}) if roster else []
    if others:
        raise UsageError(f"--episodes: episodes of roster(s) {', '.join(others)}, not '{roster.id}'")
    return episodes


def _pairs(where: str | None, flag: str = "--pairs") -> list[dict[str, Any]]:
    from mascot.training.data.pairs import read_pairs

    if not where:
        raise UsageError("--method dpo needs --pairs DIR (from mascot pairs) or a pairs JSONL file")
    path = _pairs_file(where)
    if not path.is_file():
        raise UsageError(f"{flag}: no such file {path}")
    rows = read_pairs(path)
    if not rows:
        raise UsageError(f"{flag}: no pairs in {path}")
    return rows


def _pairs_file(where: str) -> Path:
    """The pairs file a ``--pairs`` value names: a file, or ``train.jsonl`` in a folder."""
    path = Path(where)
    return path / "train.jsonl" if path.is_dir() else path


def _main_process() -> bool:
    """Whether this is the process that writes files (the only one, or rank 0 under
    ``accelerate launch``)."""
    from accelerate import PartialState

    return PartialState().is_main_process


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _train_rm(args: argparse.Namespace) -> int:
    from mascot.training.data.pairs import read_pairs
    from mascot.training.fitting.reward_model import RewardModelConfig, RewardModelError, train_reward_model

    folder = Path(args.pairs)
    if not (folder / "train.jsonl").is_file():
        raise UsageError(f"--pairs: no train.jsonl in {folder} (make it with `mascot pairs`)")
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
