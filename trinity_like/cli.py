"""The ``trinity-like`` command line: parse, then call one function per subcommand.

A user mistake (bad config, missing file) prints one line ``error: ...`` and exits with status 2, never a
traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from trinity_like.common.errors import UserError
from trinity_like.config import ConfigError
from trinity_like.config.validation import refuse_emulated

if TYPE_CHECKING:
    from trinity_like.config import Config
    from trinity_like.config.loading import Translation


def _split_config_and_overrides(items: list[str], config: str | None = None) -> tuple[str, list[str]]:
    """``run`` takes CONFIG and key=value overrides in any order: the one item without '=' is CONFIG (or
    ``-c/--config FILE``, Trinity-RFT's spelling, with only overrides among the items)."""
    paths = [x for x in items if "=" not in x]
    if config is not None:
        if paths:
            raise ConfigError(f"give the config file once: -c {config} and {' '.join(paths)}")
        return config, list(items)
    if len(paths) != 1:
        raise ConfigError(f"run takes exactly one CONFIG file (or -c FILE) besides key=value overrides, got {len(paths)}: "
                          f"{' '.join(paths) or '(none)'}")
    return paths[0], [x for x in items if "=" in x]


def _split_verl_items(items: list[str]) -> tuple[str | None, str | None, list[str]]:
    """``--verl``'s items: at most one verl YAML file, at most one verl entry point (the module a verl script
    runs with ``python3 -m``: verl.trainer.main_ppo, recipe.dapo.main_dapo; ``python3`` itself may stay), and
    the overrides (``key=value``, ``+key=value``, ``~key``) -> (file, entry, overrides)."""
    from trinity_like.config.verl_compose import ENTRIES

    file = entry = None
    overrides = []
    for item in items:
        if "=" in item or item.startswith("~"):
            overrides.append(item)
        elif item in ENTRIES:
            if entry is not None:
                raise ConfigError(f"run --verl takes one verl entry point, got {entry} and {item}")
            entry = item
        elif item in ("python", "python3", "-m"):
            continue
        elif item.endswith((".yaml", ".yml")) or "/" in item or "." not in item:
            if file is not None:
                raise ConfigError(f"run --verl takes at most one verl config file, got {file} and {item}")
            file = item
        else:
            raise ConfigError(f"run --verl: {item!r} is neither a key=value override, a YAML file nor a verl entry "
                              f"point ({', '.join(ENTRIES)})")
    return file, entry, overrides


def _load(args: argparse.Namespace) -> tuple[Config, Translation | None]:
    from trinity_like.config.loading import load_config_with_translation

    if getattr(args, "verl", False):
        file, entry, overrides = _split_verl_items(args.items)
        return load_config_with_translation(file, overrides, allow_unmapped=args.allow_unmapped, verl=True,
                                            entry=entry)
    config, overrides = _split_config_and_overrides(args.items, getattr(args, "config", None))
    return load_config_with_translation(config, [*overrides, *_plugin_overrides(args)],
                                        allow_unmapped=getattr(args, "allow_unmapped", False))


def _plugin_overrides(args: argparse.Namespace) -> list[str]:
    """``--plugin-dir DIR`` (repeatable, Trinity-RFT's flag) -> ``explorer.plugin_dirs``, after the config's own."""
    dirs = getattr(args, "plugin_dir", None) or []
    return [f"explorer.plugin_dirs={json.dumps([str(d) for d in dirs])}"] if dirs else []


def _is_trinity(translation: Translation | None) -> bool:
    from trinity_like.config.trinity import Translation as TrinityTranslation

    return isinstance(translation, TrinityTranslation)


def _cmd_run(args: argparse.Namespace) -> int:
    from trinity_like.config import to_yaml

    cfg, translation = _load(args)
    role = args.role or "all"
    if _is_trinity(translation):
        role = args.role or translation.role
        print(f"Trinity config: {_trinity_summary(translation, cfg, role)}", flush=True)
        if translation.command != "run" and not args.print_config:  # mode bench / serve: our commands of those names
            return _run_as(translation.command, args, cfg)
    elif translation is not None:
        print(f"verl config: {_verl_summary(translation, cfg)}", flush=True)
    if args.print_config:
        print(to_yaml(cfg), end="")
        return 0
    if translation is not None and role != "explorer":  # the trainer's node holds the run directory
        _keep_translation(translation, cfg)
    from trinity_like.launcher import run

    summary = run(cfg, role=role, resume=args.resume, address=args.address)
    return 0 if summary["exit_reason"] in ("completed", "stopped") else 1


def _run_as(command: str, args: argparse.Namespace, cfg: Config) -> int:
    """``run`` of a Trinity config of mode bench or serve: that command of ours, with its defaults."""
    defaults = vars(build_parser().parse_args([command, "--config", "-"]))  # that command's defaults
    defaults.update({k: v for k, v in vars(args).items() if k in defaults and v is not None and k != "func"})
    ns = argparse.Namespace(**defaults)
    if command == "bench" and not ns.checkpoint and _bench_every_checkpoint(cfg):
        ns.all_checkpoints = True  # Trinity's bench evaluates each checkpoint of the run (bench_results.jsonl)
    return _cmd_bench(ns, loaded=cfg) if command == "bench" else _cmd_serve(ns, loaded=cfg)


def _bench_every_checkpoint(cfg: Config) -> bool:
    """Trinity's mode bench: each checkpoint of the run when it has any (and bench_on_latest_checkpoint is off),
    else the model itself (Trinity's evaluation at step 0); an external model has no checkpoints."""
    from trinity_like.runtime.checkpoints import latest_checkpoint
    from trinity_like.runtime.paths import RunPaths

    ex = cfg.explorer
    return (ex.engine != "external" and not ex.bench_on_latest_checkpoint
            and latest_checkpoint(RunPaths.of(cfg).checkpoint_dir) is not None)


def _trinity_summary(translation: Translation, cfg: Config, role: str) -> str:
    """One line: what Trinity's mode became here."""
    if translation.command != "run":
        return f"mode {translation.command}: `trinity-like {translation.command}` on this config"
    if cfg.mode == "sync":
        how = "mode sync (Trinity's both with sync_interval 1, sync_offset 0: on-policy lock-step)"
    elif cfg.mode == "offline":
        how = f"mode offline: the trainer replays {', '.join(cfg.buffer.replay_sources)}"
    else:
        how = (f"mode async, synchronizer.max_staleness={cfg.synchronizer.max_staleness} (sync_interval "
               f"{cfg.synchronizer.interval} - 1 + sync_offset {cfg.synchronizer.offset})")
    who = "" if role == "all" else (f"; this job runs the {role} (run --role {role}); the other role's job meets it "
                                    "in the run directory")
    return (f"{how}; {cfg.trainer.total_steps} trainer steps{who}; {len(translation.differences)} difference(s) of "
            "meaning (config-convert lists them)")


def _verl_summary(translation: Translation, cfg: Config) -> str:
    """One line: the mode, the GPU split and how to go async."""
    split = translation.split.describe() if translation.split else "GPUs: see trainer.n_gpus_per_node"
    if cfg.mode == "sync":
        how = ("mode sync, as verl's PPO (generate, then train on exactly that batch; old log-probs recomputed); "
               "mode=async lets the explorer generate while the trainer trains, up to "
               f"synchronizer.max_staleness={cfg.synchronizer.max_staleness} version(s) behind")
    else:
        how = (f"mode {cfg.mode} (verl's PPO is sync), synchronizer.max_staleness="
               f"{cfg.synchronizer.max_staleness}, old log-probs "
               f"{'recomputed' if cfg.algorithm.off_policy.recompute_old_log_probs else 'from the engines'}")
    return f"{how}; {split}"


def _keep_translation(translation: Translation, cfg: Config) -> None:
    """A verl- or Trinity-shaped config leaves its translation in the run directory: what each key set, what had
    no effect and which keys were ignored (``verl_translation.yaml`` / ``trinity_translation.yaml``)."""
    import yaml

    from trinity_like.common.fs import atomic_write_text
    from trinity_like.runtime.paths import RunPaths

    run_dir = RunPaths.of(cfg).run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    name = "trinity_translation.yaml" if _is_trinity(translation) else "verl_translation.yaml"
    atomic_write_text(run_dir / name, yaml.safe_dump(translation.report(), sort_keys=False))
    if not _is_trinity(translation) and translation.unmapped:
        print(f"verl config: ignored {len(translation.unmapped)} key(s) with no counterpart here: "
              f"{', '.join(k for k, _, _ in translation.unmapped)} (listed in {run_dir / 'verl_translation.yaml'})")


def _cmd_config_convert(args: argparse.Namespace) -> int:
    from trinity_like.config.verl import native_yaml

    cfg, translation = _load(args)
    if translation is None:
        raise ConfigError(f"'{args.config or args.items[0]}' is not a verl-shaped config (no data, "
                          "actor_rollout_ref, critic, reward_model or custom_reward_function section) nor a "
                          "Trinity-RFT one (no buffer.explorer_input, model.model_path, algorithm.algorithm_type, "
                          "cluster, ...): it is already one of ours")
    if _is_trinity(translation):
        from trinity_like.config import to_yaml

        print(to_yaml(cfg), end="")
        print(f"# {_trinity_summary(translation, cfg, translation.role)}")
        for line in translation.differences:
            print(f"# difference: {line}")
        return 0
    print(native_yaml(translation), end="")
    print(f"# {_verl_summary(translation, cfg)}")
    for key, value, why in translation.unmapped:
        print(f"# ignored: {key} = {value!r} ({why})")
    if translation.at_default:
        print(f"# {len(translation.at_default)} of verl's defaults have no counterpart here (none changed by this "
              "config; a run lists them in verl_translation.yaml)")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    from trinity_like.status import format_status, gather_status

    config, overrides = _split_config_and_overrides(args.items) if args.items else (None, [])
    gather = lambda: gather_status(config, args.namespace, args.address, overrides)  # noqa: E731

    if args.watch is not None:
        from trinity_like.status import watch_status

        if args.watch <= 0:
            raise UserError(f"--watch takes a positive number of seconds, got {args.watch:g}")
        watch_status(gather, args.watch, args.json)
        return 0
    report = gather()
    print(json.dumps(report, indent=2) if args.json else format_status(report))
    return 0


def _cmd_bench(args: argparse.Namespace, loaded: Config | None = None) -> int:
    from trinity_like.explorer.evaluation import bench

    cfg = loaded if loaded is not None else _load(args)[0]
    refuse_emulated(cfg, "`bench`")
    if args.all_checkpoints or args.follow:  # each checkpoint of the run: explorer/evaluation.py bench_checkpoints
        from trinity_like.explorer.evaluation import bench_checkpoints_command

        return bench_checkpoints_command(cfg, args)
    rows = bench(cfg, args.checkpoint)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    metrics = [k for k in rows[0] if k not in ("taskset", "tasks", "k", "temperature")]
    print(f"{'taskset':<16}{'tasks':>7}{'k':>4}" + "".join(f"{m:>20}" for m in metrics))
    for r in rows:
        print(f"{r['taskset']:<16}{r['tasks']:>7}{r['k']:>4}" + "".join(f"{r[m]:>20.4f}" for m in metrics))
    return 0


def _cmd_serve(args: argparse.Namespace, loaded: Config | None = None) -> int:
    from trinity_like.serve.server import serve

    cfg = loaded if loaded is not None else _load(args)[0]
    refuse_emulated(cfg, "`serve`")
    return serve(cfg, host=args.host, port=args.port, api_key=args.api_key, address=args.address)


def _cmd_plot(args: argparse.Namespace) -> int:
    from trinity_like.plot import plot_run

    paths, skipped = plot_run(args.run_dir, args.out)
    for path in paths:
        print(path)
    for note in skipped:
        print(f"skipped {note}")
    return 0


def _cmd_make_tiny_model(args: argparse.Namespace) -> int:
    from trinity_like.common.offline import set_offline_env
    from trinity_like.common.tiny_model import make_tiny_model

    set_offline_env()
    path = make_tiny_model(args.out_dir, seed=args.seed, layers=args.layers, hidden=args.hidden,
                           reward_head=args.reward_head)
    print(f"tiny {'reward model' if args.reward_head else 'model'} written to {path}")
    return 0


def _cmd_config_docs(args: argparse.Namespace) -> int:
    from trinity_like.config_docs import DOCS_PATH, run

    return run(args.out or DOCS_PATH, check=args.check)


def _config_flags(p: argparse.ArgumentParser) -> None:
    """Trinity-RFT's spellings: ``-c/--config FILE`` and ``--plugin-dir DIR`` (repeatable)."""
    p.add_argument("-c", "--config", metavar="FILE", help="the config file (instead of the CONFIG item)")
    p.add_argument("--plugin-dir", action="append", metavar="DIR",
                   help="a folder of user modules (workflows, reward functions) imported before they are looked up; "
                        "repeatable (explorer.plugin_dirs)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trinity-like", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="run explorer, buffer, trainer and synchronizer as configured")
    p.add_argument("items", nargs="*", metavar="CONFIG | key=value",
                   help="a YAML config file (e.g. configs/quickstart.yaml; a verl or Trinity-RFT config too) and "
                        "dotted overrides such as trainer.total_steps=5 mode=sync, in any order")
    _config_flags(p)
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.add_argument("--role", choices=("all", "explorer", "trainer"), default=None,
                   help="run every part in this job (all, the default; a Trinity-RFT config of mode explore / train: "
                        "explorer / trainer), or one part as an independent job that meets the others through the "
                        "run directory and the Ray namespace <project>/<name>")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in its run directory: the trainer loads its latest checkpoint and the "
                        "buffer re-delivers what was consumed after it")
    p.add_argument("--address", help="Ray cluster to join (default: RAY_ADDRESS, set by `ray job submit`, else "
                                     "the `ray start` cluster of this node, else a private Ray instance; `local`: "
                                     "always a private one); the job says which in one line")
    p.add_argument("--allow-unmapped", action="store_true",
                   help="a verl-shaped config: run without its keys that have no counterpart here (listed in the "
                        "run directory) instead of refusing it")
    p.add_argument("--verl", action="store_true",
                   help="the items are a verl launch: [verl YAML] [verl.trainer.main_ppo | recipe.dapo.main_dapo] "
                        "and verl's key=value overrides (keys only ours has, such as mode=async, apply after the "
                        "translation); see docs/verl.md")
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("config-convert", help="print the config of ours that a verl or Trinity-RFT config "
                                              "translates to (a Trinity one ends with its differences of meaning)")
    p.add_argument("items", nargs="*", metavar="FILE | key=value",
                   help="a verl config file (sections data, actor_rollout_ref, trainer, ...) or a Trinity-RFT one "
                        "(buffer.explorer_input, model.model_path, ...) and overrides; with --verl, a verl launch as "
                        "`run --verl` takes it")
    _config_flags(p)
    p.add_argument("--verl", action="store_true", help="the items are a verl launch (see run --verl)")
    p.add_argument("--allow-unmapped", action="store_true",
                   help="convert without the keys that have no counterpart here (listed as comments)")
    p.set_defaults(func=_cmd_config_convert)

    p = sub.add_parser("status", help="roles alive, their versions, the buffer's unconsumed rows and staleness")
    p.add_argument("items", nargs="*", metavar="CONFIG | key=value",
                   help="the run's config file and the overrides it was run with (or give --namespace)")
    p.add_argument("--namespace", help="the run's Ray namespace <project>/<name>")
    p.add_argument("--address", help="Ray cluster (default: RAY_ADDRESS, else the `ray start` cluster of this node, "
                                     "else the one the run directory records for the run's live roles)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--watch", nargs="?", type=float, const=2.0, metavar="SECONDS",
                   help="redraw every SECONDS (default 2) until Ctrl-C; with --json, one JSON object per line")
    p.set_defaults(func=_cmd_status)

    p = sub.add_parser("bench", help="evaluate a model or checkpoint on the config's eval task sets")
    p.add_argument("items", nargs="*", metavar="CONFIG | key=value")
    _config_flags(p)
    p.add_argument("--checkpoint", help="a .safetensors state dict, a trainer checkpoint folder or an HF model folder")
    p.add_argument("--all-checkpoints", action="store_true",
                   help="each complete checkpoint of the run, in step order, one row each into --results")
    p.add_argument("--follow", action="store_true", help="--all-checkpoints, then each new checkpoint as it lands, "
                   "until the run ends or --timeout")
    p.add_argument("--timeout", type=float, default=0.0, metavar="SECONDS", help="with --follow: stop after SECONDS")
    p.add_argument("--results", metavar="FILE", help="results of --all-checkpoints/--follow (JSON lines; default "
                   "<run_dir>/bench_results.jsonl); steps it holds already are not benched again")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_bench)

    p = sub.add_parser("serve", help="OpenAI-compatible endpoint that records agents' completions as experiences")
    p.add_argument("items", nargs="*", metavar="CONFIG | key=value",
                   help="the run's config file and dotted overrides (serve.* settings)")
    _config_flags(p)
    p.add_argument("--host", help="address to listen on (default serve.host, 127.0.0.1); any other than loopback "
                                  "needs --api-key")
    p.add_argument("--port", type=int, help="port (default serve.port, 8000; 0 = any free port)")
    p.add_argument("--api-key", help="bearer key clients must send (default serve.api_key or "
                                     "TRINITY_SERVE_API_KEY)")
    p.add_argument("--address", help="Ray cluster to join (default: RAY_ADDRESS, else the `ray start` cluster of "
                                     "this node, else a private Ray instance; `local`: always a private one)")
    p.set_defaults(func=_cmd_serve)

    p = sub.add_parser("plot", help="PNG figures of a run: reward and eval, staleness, IS weights and ESS, a "
                                    "timeline of explorer / trainer / syncs, throughput")
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run directory <checkpoint_root_dir>/<project>/<name> "
                                                      "(the folder holding metrics.jsonl)")
    p.add_argument("--out", metavar="DIR", help="folder for the PNGs (default RUN_DIR/plots)")
    p.set_defaults(func=_cmd_plot)

    p = sub.add_parser("make-tiny-model", help="build the offline tiny tokenizer + Qwen2 model")
    p.add_argument("out_dir")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--reward-head", action="store_true",
                   help="a sequence-classification model with one label (a reward model, reward.model.path)")
    p.set_defaults(func=_cmd_make_tiny_model)

    p = sub.add_parser("config-docs", help="regenerate docs/config.md, the configuration reference, from the "
                                          "config dataclasses")
    p.add_argument("--out", help="where to write (default: docs/config.md of this checkout)")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if the file is out of date")
    p.set_defaults(func=_cmd_config_docs)

    from trinity_like.buffer.cli import add_buffer_commands

    add_buffer_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # Flags and key=value overrides may come in any order: overrides that argparse could not place after a
    # flag come back as extras and join the others.
    args, extras = parser.parse_known_args(argv)
    if extras:
        bad = [x for x in extras if x.startswith("-") or not hasattr(args, "items")]
        if bad:
            parser.error(f"unrecognized arguments: {' '.join(bad)}")
        args.items = [*args.items, *extras]
    try:
        return args.func(args)
    except (UserError, FileNotFoundError) as e:
        cause = getattr(e, "cause", None)  # raised inside a Ray actor, it arrives wrapped with a traceback
        print(f"error: {cause if isinstance(cause, UserError) else e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
