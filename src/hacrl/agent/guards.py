"""The stops a worker's phases end with when a device runs out of memory or a model turns non-finite: one message
naming the agent, the phase, the peak and the knobs to turn (the run's newest checkpoint is intact: resume with the
smaller setting). What a worker's process does with host memory it frees: `hacrl.agent.host_memory`."""

from __future__ import annotations

import contextlib

import torch

from hacrl.agent import host_memory
from hacrl.errors import NonFiniteError, OutOfMemory, first_line

KNOBS = {
    "sampling": "rollout.batch_size (with `auto`: a larger rollout.kv_cache_margin), rollout.max_new_tokens",
    "old log-probs": "trainer.logprob_batch_size, trainer.logprob_chunk_size",
    "the update": "trainer.micro_batch_size, agents.{i}.gradient_checkpointing=true, trainer.logprob_chunk_size",
    "evaluation": "eval.batch_size, eval.max_prompts",
}
"""The settings that lower each phase's memory (`{i}`: the agent's index)."""


@contextlib.contextmanager
def phase(name: str, index: int, device: torch.device, what: str, step: int | None):
    """Agent `name` (`agents.<index>`) in phase `what` of `step`: device or host out of memory becomes OutOfMemory,
    torch.multinomial on NaN / inf probabilities NonFiniteError, each with the fix."""
    try:
        yield
    except (torch.OutOfMemoryError, MemoryError) as e:
        raise OutOfMemory(oom_message(name, index, device, what, step, e)) from None
    except RuntimeError as e:
        if "can't allocate memory" in str(e):  # the CPU allocator's out of memory is a plain RuntimeError
            raise OutOfMemory(oom_message(name, index, device, what, step, e)) from None
        if "`inf`, `nan`" in str(e):  # torch.multinomial on non-finite probabilities
            raise NonFiniteError(
                f"agent {name!r}: its model produced NaN or inf during {what}"
                f"{f' at step {step}' if step else ''} ({first_line(e)}). Its weights or "
                f"activations overflowed: lower agents.{index}.lr, or use dtype float32 / bfloat16 instead "
                "of float16, and resume from the newest checkpoint (checkpoints never hold non-finite weights)."
            ) from None
        raise


def oom_message(name: str, index: int, device: torch.device, what: str, step: int | None, error: BaseException) -> str:
    peak = ""
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        peak = f" (peak {torch.cuda.max_memory_allocated(device) / 2**30:.1f} of {total / 2**30:.1f} GiB)"
    host = ""
    if device.type == "cpu" and not host_memory.released():
        host = (" or set runtime.host_memory=release (freed activations go back to the system: about 0.76x the "
                "peak at about 1.2x the step on SmolLM2)")  # fmt: skip
    return (
        f"agent {name!r} ran out of memory on {device} during {what}{f' at step {step}' if step else ''}"
        f"{peak}: {first_line(error)}. Lower {KNOBS[what].format(i=index)}{host} (`hacrl plan CONFIG` shows where "
        "the memory goes), then continue with `hacrl train CONFIG --resume KEY=VALUE`: this step was not saved, the "
        "newest checkpoint is intact."
    )


def device_memory(device: torch.device) -> dict[str, int]:
    """A device's memory: the peak allocated since the previous call and its total, in bytes (the peak is reset;
    zeros on a CPU)."""
    if device.type != "cuda":
        return {"peak": 0, "total": 0}
    peak = torch.cuda.max_memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    return {"peak": peak, "total": torch.cuda.get_device_properties(device).total_memory}
