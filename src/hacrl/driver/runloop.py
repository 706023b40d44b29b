"""The run around a trainer's steps, one implementation for `hacrl train` (`hacrl.driver.trainer.Trainer`) and
`hacrl control` (`hacrl.control.trainer.ControlTrainer`).

`RunLoop` owns what does not depend on what is trained (docs/reliability.md, "Failure and safety"):
- the run directory, claimed and locked for the trainer's lifetime (released by `close`, which `train` calls, or
  when the trainer is dropped); a start refused in `_setup` leaves nothing behind;
- the metrics logger (metrics.jsonl, TensorBoard, console), a resumed run's stale records dropped first;
- the step loop: evaluation at the start (`eval.at_start`), every `eval.every` steps and after the last step;
  a checkpoint every `checkpoint.every` steps and after the last step;
- a graceful stop: SIGTERM or Ctrl-C finish the current step, write a checkpoint (unless the newest one is of this
  step already) and raise `TrainingInterrupted`; a second signal stops at once.

A subclass supplies `_setup(resume)` (it sets `plan`, `names`, `step` and `history`), `train_step`, `evaluate`,
`save`, `_write_config`, and may add `_finished` (said once the last step is done) and extend `close`.
"""

from __future__ import annotations

import signal
import sys
import threading
import weakref
from dataclasses import asdict
from pathlib import Path
from typing import Any, ClassVar

from hacrl.checkpoint import latest_checkpoint
from hacrl.driver.logger import MetricsLogger, check_trackers
from hacrl.driver.resume import ResumePlan, prepare_run_dir
from hacrl.driver.rundir import RunLock, claim_run_dir
from hacrl.errors import INTACT, TrainingInterrupted, WorkerError


class RunLoop:
    """One run of a trainer in its run directory (see the module docstring for what it owns)."""

    command: ClassVar[str] = "hacrl train"
    """How a user continues the run (`<command> <config> --resume`), said when it is interrupted."""

    plan: ResumePlan
    names: list[str]
    step: int
    history: list[dict[str, Any]]

    def __init__(self, config: Any, *, resume: str | None = None) -> None:
        self.config = config
        self.run_dir = Path(config.trainer.output_dir)
        self._logger: MetricsLogger | None = None
        self._in_progress: int | None = None
        check_trackers(config.logging)  # W&B online without credentials: refused before the directory is claimed
        claim = claim_run_dir(self.run_dir)  # a foreign directory is refused before anything is written there
        try:
            self.lock = RunLock(self.run_dir, notice=self.notice).acquire()
        except BaseException:
            claim.undo()
            raise
        self._release = weakref.finalize(self, self.lock.release)  # also when a trainer is dropped without close()
        try:
            self._setup(resume or config.checkpoint.resume)
        except BaseException as e:
            self.close(force=True)
            claim.undo()  # a refused start leaves nothing behind (the mark of a new claim, a directory it created)
            self._say_where_to_resume(e)
            raise

    # -- what a subclass supplies ------------------------------------------------------------------------------------

    def _setup(self, resume: str) -> None:
        raise NotImplementedError

    def train_step(self) -> dict[str, Any]:
        raise NotImplementedError

    def evaluate(self) -> dict[str, float]:
        raise NotImplementedError

    def save(self) -> Path:
        raise NotImplementedError

    def _write_config(self, path: Path) -> None:
        raise NotImplementedError

    def _finished(self) -> str | None:
        """A line for the console once the last step is done (None: nothing)."""
        return None

    # -- the run -------------------------------------------------------------------------------------------------

    def notice(self, message: str) -> None:
        """Something the user should see now (a fallback, a takeover, a stop): the console, or stderr."""
        if self._logger is not None:
            self._logger.print(message)
        else:
            print(f"hacrl: {message}", file=sys.stderr, flush=True)

    def close(self, *, force: bool = False) -> None:
        """Release the run directory (idempotent); a subclass also stops what it started (`force`: at once, without
        waiting for a call its workers are in)."""
        self._release()

    def _say_where_to_resume(self, error: BaseException) -> None:
        """A worker's error says the latest checkpoint is intact (`INTACT`): where the run has none, raise it saying
        what is true instead (nothing was written; or `--resume` starts again from step 0)."""
        if not isinstance(error, WorkerError) or INTACT not in str(error):
            return
        if latest_checkpoint(self.run_dir) is not None:
            return
        truth = (
            f"The run has no checkpoint yet: `{self.command} <config> --resume` starts it again from step 0"
            if (self.run_dir / "metrics.jsonl").exists()
            else f"Nothing of the run was written: start it again with `{self.command} <config>`"
        )
        raise WorkerError(str(error).replace(INTACT, truth)) from None

    def train(self) -> list[dict[str, Any]]:
        """Run from `self.step` to `trainer.steps`; returns every step's metrics (also logged)."""
        force = True  # whatever stops the run mid-step (an error, a second signal) stops its workers at once
        # the graceful stop holds from the run directory's preparation to the workers' close: a signal in either
        # (the set-up before step 1, the close after the last) is said and ends the run as between two steps (it
        # killed the process silently, exit -15)
        with GracefulStop(
            self.notice, lambda: self._in_progress, self.command, lambda: latest_checkpoint(self.run_dir)
        ) as stop:
            try:
                self._open_logger()
                self._loop(stop)
                force = False
            except TrainingInterrupted as e:
                force = e.at_once  # the first signal's stop ends after a step and its checkpoint: the workers are idle
                raise
            except WorkerError as e:
                self._say_where_to_resume(e)
                raise
            finally:
                try:
                    if self._logger is not None:
                        logger, self._logger = self._logger, None
                        logger.close()  # may raise (a full disk): the workers are stopped all the same
                finally:
                    self.close(force=force)
        return self.history

    def _open_logger(self) -> None:
        cfg = self.config
        prepare_run_dir(self.plan, self.run_dir, self.notice)
        self._write_config(self.run_dir / "config.yaml")
        self._logger = MetricsLogger(
            cfg.logging,
            self.run_dir,
            cfg.trainer.steps,
            self.names,
            purge_step=self.plan.purge_step,
            config=asdict(cfg),
        )
        if self.plan.checkpoint:
            self._logger.print(f"resumed from {self.plan.checkpoint} at step {self.step}")

    def _loop(self, stop: GracefulStop) -> None:
        cfg = self.config
        steps = cfg.trainer.steps
        last_saved = self.step if self.plan.checkpoint else None
        if self.step == 0 and cfg.eval.at_start:
            self._logger.log(0, self.evaluate())
        for step in range(self.step + 1, steps + 1):
            if stop.signum is not None:
                break
            self._in_progress = step  # until its checkpoint is written (what a stop's notice says it finishes)
            metrics = self.train_step()
            self.step = step
            if step == steps or (cfg.eval.every and step % cfg.eval.every == 0):
                metrics.update(self.evaluate())
            self._logger.log(step, metrics)
            self._logger.step_done(step, metrics)
            self.history.append({"step": step, **metrics})
            if step == steps or (cfg.checkpoint.every and step % cfg.checkpoint.every == 0):
                self.save()
                last_saved = step
            self._in_progress = None
        if self.step == steps and (line := self._finished()):
            self._logger.print(line)
        if stop.signum is not None and self.step < steps:
            name = signal.Signals(stop.signum).name
            if self.step > 0 and last_saved != self.step:
                where = f"wrote checkpoint {self.save()}"
            elif last_saved is not None:
                where = f"its latest checkpoint is {latest_checkpoint(self.run_dir)}"
            else:
                where = "no step had finished, so there is nothing to save"
            raise TrainingInterrupted(
                f"stopped by {name} after step {self.step} of {steps}; {where}. Continue with "
                f"`{self.command} <config> --resume` (trainer.output_dir={str(self.run_dir)!r}).",
                stop.signum,
            )


class GracefulStop:
    """SIGTERM / SIGINT while training: note it, let the loop finish its step and checkpoint. A second signal of
    either kind stops at once, without a checkpoint and without a traceback (`TrainingInterrupted`: one message,
    exit 128 + signal). Installed only in the main thread (signals cannot be caught elsewhere)."""

    def __init__(self, notice, in_progress, command: str = "hacrl train", newest=lambda: None) -> None:
        self.signum: int | None = None
        self._notice = notice
        self._in_progress = in_progress  # the step being trained, logged or checkpointed now (None: between steps)
        self._command = command
        self._newest = newest  # the newest complete checkpoint now (None: the run has none)
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame) -> None:
        if self.signum is not None:
            for sig, handler in self._previous.items():  # a third signal gets the default behaviour
                signal.signal(sig, handler)
            newest = self._newest()
            where = (
                f"the newest checkpoint, {newest.name}, is intact: continue with `{self._command} <config> --resume`"
                if newest is not None
                else f"the run has no checkpoint yet: `{self._command} <config> --resume` starts it again from step 0"
            )
            step = self._in_progress()
            raise TrainingInterrupted(
                f"stopped at once by a second {signal.Signals(signum).name}"
                f"{f' during step {step}' if step is not None else ''}, without a checkpoint; {where}",
                signum,
                at_once=True,
            )
        self.signum = signum
        again = " (Ctrl-C or SIGTERM again stops at once, without a checkpoint)"
        step = self._in_progress()
        doing = f"finishing step {step}, then writing a checkpoint and" if step is not None else "between steps:"
        self._notice(f"{signal.Signals(signum).name} received: {doing} stopping{again}")

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
