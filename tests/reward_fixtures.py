"""Reward functions for the tests, importable by scoring processes (`tests.reward_fixtures:<name>`); light imports."""

from __future__ import annotations

import os
import time


def digits(prompts, completions, **columns):
    """A quarter point per digit, at most 1."""
    return [min(1.0, sum(ch.isdigit() for ch in c) / 4) for c in completions]


def hangs_on_hang(prompts, completions, **columns):
    """Never returns for a completion containing "hang" (a busy loop: no signal or exception gets it out)."""
    for c in completions:
        if "hang" in c:
            while True:
                pass
    return [1.0] * len(completions)


def slow(prompts, completions, **columns):
    time.sleep(0.05 * len(completions))
    return [0.5] * len(completions)


def exits_on_boom(prompts, completions, **columns):
    if any("boom" in c for c in completions):
        os._exit(3)
    return [0.0] * len(completions)


def numeric_strings(prompts, completions, **columns):
    return ["1.0"] * len(completions)


def a_dict(prompts, completions, **columns):
    return {"reward": 1.0}


def raises_on_x(prompts, completions, **columns):
    if any("x" in c for c in completions):
        raise KeyError("oops")
    return [1.0] * len(completions)


def batch_position(prompts, completions, **columns):
    """Depends on the position in the call: must only ever be used to show that slicing is contiguous."""
    return [min(1.0, i / 100) for i in range(len(completions))]


def sleeps_forever(prompts, completions, **columns):
    """A hung reward function: never returns, whatever the text."""
    time.sleep(10**6)


def hangs_with_a_child(prompts, completions, **columns):
    """Starts a subprocess of its own (a marker `sleep` its test can find), then hangs."""
    import subprocess

    subprocess.Popen(["sleep", columns.get("marker", ["4242.5"])[0]])
    time.sleep(10**6)


def hangs_with_a_detached_child(prompts, completions, **columns):
    """Starts a `sleep` that leaves its process group and its parent (setsid, then the shell between exits), then
    hangs: the kind of process a reward function's library may leave behind."""
    import subprocess

    marker = columns.get("marker", ["4243.5"])[0]
    subprocess.Popen(["sh", "-c", f"sleep {marker} &"], start_new_session=True).wait()
    time.sleep(10**6)


def text_hash(prompts, completions, **columns):
    """A reward in [0, 1) from the text's SHA-256: any two different answers score differently (every group with two
    different answers has advantages, whatever a model writes)."""
    import hashlib

    return [int(hashlib.sha256(c.encode()).hexdigest()[:8], 16) / 2**32 for c in completions]
