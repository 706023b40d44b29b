"""Metric sinks: console (rich progress bar + one summary line per step), JSONL, TensorBoard, and optionally
Weights & Biases and trackio (`logging.wandb`, `logging.trackio`: every finite numeric metric of every step, with the
resolved config).

Metric keys are `<agent>/<metric>` for per-agent values (`llama/reward_mean`, `qwen/rho/llama`), `eval/<agent>/...`
for evaluation and `time/...` for the step's time split: `hacrl.driver.metrics` lists them all.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from hacrl import faults
from hacrl.config import LoggingConfig
from hacrl.driver.metrics import agent_key
from hacrl.errors import ConfigError, first_line


class MetricsLogger:
    def __init__(
        self,
        cfg: LoggingConfig,
        run_dir: Path,
        total_steps: int,
        agent_names: list[str],
        *,
        purge_step: int | None = None,
        config: dict[str, Any] | None = None,
    ) -> None:
        """`purge_step`: a resumed run's first new step; TensorBoard hides events of that step and later that an
        interrupted earlier attempt wrote. `config`: the resolved config, for the trackers."""
        self.cfg = cfg
        self.agent_names = agent_names
        self._all_clipped = dict.fromkeys(agent_names, 0)  # steps in a row whose every foreign row was clipped
        self._jsonl = open(run_dir / "metrics.jsonl", "a") if cfg.jsonl else None  # noqa: SIM115 - closed in close()
        self._tb = None
        if cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            _quiet_writer_thread_errors()
            self._tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"), purge_step=purge_step)
        try:
            self._trackers = _start_trackers(cfg, run_dir, config or {})
        except BaseException:
            for sink in (self._jsonl, self._tb):
                if sink is not None:
                    sink.close()
            raise
        self._console = None
        self._progress = None
        if cfg.console:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._console = Console()
            self._progress = Progress(
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                console=self._console,
                transient=False,
            )
            self._task = self._progress.add_task("train", total=total_steps)
            self._progress.start()

    def print(self, message: str) -> None:
        if self._console is not None:
            self._console.print(message)
        else:
            print(message, flush=True)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        clean = {k: _plain(v) for k, v in metrics.items()}
        if self._jsonl is not None:
            line = json.dumps({"step": step, **clean}) + "\n"
            faults.hit("metrics.write", before=lambda: (self._jsonl.write(line[: len(line) // 2]), self._jsonl.flush()))
            self._jsonl.write(line)
            self._jsonl.flush()
        numbers = {k: v for k, v in clean.items() if _finite_number(v)}
        if self._tb is not None:
            for key, value in numbers.items():
                self._tb.add_scalar(key, value, step)
            self._tb.flush()
        for tracker in self._trackers:
            tracker.log(numbers, step=step)

    def step_done(self, step: int, metrics: dict[str, Any]) -> None:
        parts = [f"step {step}"]
        for name in self.agent_names:

            def value(metric: str, name: str = name):
                return metrics.get(agent_key(name, metric))

            if value("reward_mean") is not None:
                part = f"{name}: reward {value('reward_mean'):.3f}"
                if value("capability") is not None:
                    part += f" cap {value('capability'):.3f}"
                if value("own_clip_frac") is not None:
                    part += f" clip {value('own_clip_frac'):.2f}"
                if value("foreign_clip_frac") is not None:
                    part += f"/{value('foreign_clip_frac'):.2f}"
                if value("shared_offered"):
                    part += f" kept {value('shared_kept')}/{value('shared_offered')}"
                parts.append(part)
        skipped = {n: metrics.get(agent_key(n, "skipped_steps"), 0) for n in self.agent_names}
        if any(skipped.values()):
            parts.append("SKIPPED non-finite grad: " + ", ".join(f"{n} x{k}" for n, k in skipped.items() if k))
        if "time/step" in metrics:
            parts.append(f"{metrics['time/step']:.1f}s" + _slowest(metrics, self.agent_names))
        self.print(" | ".join(parts))
        self._note_all_clipped(metrics)
        if self._progress is not None:
            self._progress.update(self._task, completed=step)

    def _note_all_clipped(self, metrics: dict[str, Any]) -> None:
        """Say once per streak when a learner's foreign rows have all been clipped for `ALL_CLIPPED_STEPS` steps in a
        row: the real bed's round found sharing idle that way, with only the optimizer's momentum step left of it."""
        for name in self.agent_names:
            clipped = metrics.get(agent_key(name, "foreign_clip_frac"))
            self._all_clipped[name] = self._all_clipped[name] + 1 if clipped is not None and clipped >= 1.0 else 0
            if self._all_clipped[name] == ALL_CLIPPED_STEPS:
                self.print(
                    f"note: every foreign row of {name!r} has been outside its clipping window for "
                    f"{ALL_CLIPPED_STEPS} steps: sharing gives it no gradient, but each mini-batch of foreign rows "
                    "still takes an optimizer step (AdamW's momentum moves the weights again) unless "
                    "trainer.zero_grad_step=skip. A window that fits the pair: algorithm.foreign_center=median (or a "
                    "larger algorithm.delta, algorithm.foreign_ratio); foreign rows in every step: "
                    'trainer.mini_batch_layout=mixed. See docs/design.md, "When every foreign row is clipped"'
                )

    def close(self) -> None:
        """Close every sink, even when one fails (a full disk): the first error is raised after all were tried."""
        closers = [self._progress.stop] if self._progress is not None else []
        closers += [s.close for s in (self._jsonl, self._tb) if s is not None]
        closers += [t.finish for t in self._trackers]
        self._progress = self._jsonl = self._tb = None
        self._trackers = []
        error = None
        for close in [lambda: faults.hit("logger.close"), *closers]:
            try:
                close()
            except Exception as e:  # noqa: BLE001 - the others still close; the first error is raised below
                error = error or e
        if error is not None:
            raise error


_QUIET = False
ALL_CLIPPED_STEPS = 5
"""Steps in a row with `foreign_clip_frac` 1.0 after which the console says so, once per streak."""


def _slowest(metrics: dict[str, Any], names: list[str]) -> str:
    """` (idle 35 %; slowest: sampling qwen, update qwen)`: which agent each phase waited for (`hacrl.driver.pace`);
    empty with one agent."""
    if len(names) < 2 or "time/idle_frac" not in metrics:
        return ""
    if agent_key(names[0], "time/wait_step") in metrics:  # trainer.lag: no barrier between sampling and update

        def busy(n: str) -> float:
            return sum(metrics.get(agent_key(n, f"time/busy_{p}"), 0.0) for p in ("sampling", "update"))

        return f" (idle {100 * metrics['time/idle_frac']:.0f} %; slowest: {max(names, key=busy)}, sampling + update)"
    slowest = [
        f"{phase} {max(names, key=lambda n: metrics.get(agent_key(n, f'time/busy_{phase}'), 0.0))}"
        for phase in ("sampling", "update")
    ]
    return f" (idle {100 * metrics['time/idle_frac']:.0f} %; slowest: {', '.join(slowest)})"


def _quiet_writer_thread_errors() -> None:
    """TensorBoard writes from a thread of its own; when a write fails there (a full disk) that thread prints a
    traceback, and the same error is raised again in the training thread at the next write, where the CLI reports
    it as one paragraph. Keep the thread's copy off the console."""
    global _QUIET
    if _QUIET:
        return
    import threading

    previous = threading.excepthook

    def hook(args) -> None:
        if type(args.thread).__name__ == "_AsyncWriterThread" and isinstance(args.exc_value, OSError):
            return
        previous(args)

    threading.excepthook = hook
    _QUIET = True


def check_trackers(cfg: LoggingConfig, where: str = "logging") -> None:
    """Before anything is written: a tracker that cannot start says so with its fix (W&B online without
    credentials failed after the run directory was created)."""
    if cfg.wandb is not None and cfg.wandb.mode == "online":
        import wandb

        try:
            wandb.login(verify=False)
        except wandb.errors.Error as e:
            raise ConfigError(
                f"{where}.wandb.mode=online needs W&B credentials ({first_line(e)}): run `wandb login` or set "
                f"WANDB_API_KEY, or set {where}.wandb.mode=offline (`wandb sync` uploads the run later)"
            ) from None


def _finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _start_trackers(cfg: LoggingConfig, run_dir: Path | None, config: dict[str, Any]) -> list[Any]:
    """The experiment trackers the config asks for, started (each has `log(metrics, step=)` and `finish()`)."""
    trackers: list[Any] = []
    name = run_dir.name if run_dir is not None else "hacrl"
    if cfg.wandb is not None:
        import hashlib

        import wandb

        w = cfg.wandb
        run_id = hashlib.sha256(str(run_dir.resolve() if run_dir else name).encode()).hexdigest()[:16]
        trackers.append(
            _started(
                "wandb",
                wandb.errors.Error,
                wandb.init,
                project=w.project,
                entity=w.entity,
                name=w.name or name,
                mode=w.mode,
                dir=str(run_dir) if run_dir is not None else None,
                config={**config, "run_dir": str(run_dir)},
                id=run_id,  # the same W&B run when this run directory resumes
                resume="allow",
                reinit="create_new",
            )
        )
    if cfg.trackio is not None:
        import trackio

        t = cfg.trackio
        trackers.append(
            trackio.init(
                project=t.project,
                name=t.name or name,
                space_id=t.space_id,
                config={**config, "run_dir": str(run_dir)},
                resume="allow",
                auto_log_cpu=False,
                auto_log_gpu=False,
            )
        )
    return trackers


def _started(key: str, errors, start, **kwargs):
    """`start(**kwargs)`, a tracker's init; its own errors (no network, a bad key) named with the setting to change."""
    try:
        return start(**kwargs)
    except errors as e:
        raise ConfigError(
            f"logging.{key} could not start ({type(e).__name__}: {first_line(e)}); fix that, or log without it: "
            f"remove logging.{key}" + (" or set logging.wandb.mode=offline" if key == "wandb" else "")
        ) from None


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    return value
