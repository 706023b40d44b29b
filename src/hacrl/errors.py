"""The errors a user can cause and fix, and the warnings hacrl gives.

Every anticipated problem with what a user hands hacrl (config, data, model directory, tokenizer, reward function,
checkpoint, run directory) raises a subclass of `HacrlError` whose message names the file or key and says what to
do. The CLI prints such a message as one paragraph and exits with status 2, without a traceback (`HACRL_DEBUG=1`
shows it). Anything else that escapes is a bug in hacrl and keeps its traceback.

The subclasses also derive from the built-in exception a caller would have caught before (`ValueError`, ...), so
code written against earlier versions keeps working.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from pathlib import Path


class HacrlError(Exception):
    """A problem with the user's input or environment; the message says what is wrong and how to fix it."""


class ConfigError(HacrlError, ValueError):
    """A config problem, found before anything heavy happens; the message says what to set."""


class DataError(HacrlError, ValueError):
    """A data file, row or task that cannot be used; the message names the file and line or the task."""


class ModelError(HacrlError, ValueError):
    """A model or tokenizer directory that cannot be loaded; the message names the directory and what is missing."""


class RewardError(HacrlError, RuntimeError):
    """A reward function failed or returned something unusable; the run stops (no silent zero)."""


class CheckpointError(HacrlError, ValueError):
    """A checkpoint that is damaged, incomplete or does not fit the run; the message names its path."""


class RunDirError(HacrlError, RuntimeError):
    """A run directory that cannot be used as asked (in use by another process, holds another run, ...)."""


class WorkerError(HacrlError, RuntimeError):
    """An agent worker's process died (killed, out of memory, a crash in native code) or went silent past its
    deadline; names the agent and what it was doing. The latest checkpoint is intact (`INTACT`; where the run has
    none, the run loop says so instead)."""


INTACT = "The latest checkpoint is intact: continue with `hacrl train <config> --resume`"
"""How a worker's error ends; `hacrl.driver.runloop` puts what is true in its place when the run has no checkpoint."""


class OutOfMemory(HacrlError, MemoryError):
    """A device ran out of memory in one phase of a step; names the agent, the phase, the peak and the knobs to
    turn. The latest checkpoint is intact and the run resumes with the smaller setting."""


class NonFiniteError(HacrlError, FloatingPointError):
    """NaN or inf in a model's weights or outputs; names the agent and where. Never written into a checkpoint."""


class TrainingInterrupted(HacrlError):
    """Training stopped on SIGTERM / SIGINT after finishing its step and writing a checkpoint."""

    def __init__(self, message: str, signum: int, *, at_once: bool = False) -> None:
        super().__init__(message)
        self.signum = signum
        self.at_once = at_once
        """A second signal: stopped mid-step, without a checkpoint (the workers are killed, not waited for)."""


class HacrlWarning(UserWarning):
    """Something a user should know that does not stop the run (a slow reward function, eval data = train data)."""


def clip(text: str, limit: int = 60) -> str:
    """`text`, or its first `limit` characters and "..." when it is longer (for quoting untrusted text in a
    message)."""
    return text if len(text) <= limit else text[:limit] + "..."


def first_line(error: BaseException, limit: int = 200) -> str:
    """An exception's first message line, cut to `limit` characters (its type's name when it has no message).
    torch's refusal to unpickle code (`torch.load(weights_only=True)` on a file holding other objects) is said in
    hacrl's words: its own first line advises loading with `weights_only=False`, which runs whatever the file holds."""
    text = str(error).strip()
    if text.startswith("Weights only load failed"):
        cause = next((line.strip() for line in text.splitlines() if "WeightsUnpickler error:" in line), "")
        cause = cause.replace("WeightsUnpickler error:", "").split(". Please use")[0].strip()
        text = (
            "it holds objects other than tensors and plain values"
            + (f" ({cause})" if cause else "")
            + ", which hacrl never unpickles: the file is damaged or was not written by hacrl"
        )
        return text[: max(limit, 300)]
    return text.splitlines()[0][:limit] if text else type(error).__name__


def warn(message: str) -> None:
    """Emit a `HacrlWarning`; the CLI prints it as one `hacrl: warning: ...` line."""
    warnings.warn(message, HacrlWarning, stacklevel=2)


@contextmanager
def restoring(checkpoint: str | Path, what: str):
    """Run the restore of `what` from a checkpoint's state.json: a value of the wrong shape (a KeyError, TypeError or
    ValueError from the restoring code) is a CheckpointError naming the checkpoint, not a traceback."""
    try:
        yield
    except HacrlError:
        raise
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise CheckpointError(
            f"{checkpoint}: its state.json's {what} cannot be restored ({type(e).__name__}: {first_line(e)}); resume "
            "with the settings of the run that wrote it, or from another checkpoint (checkpoint.resume=<dir>)"
        ) from None
