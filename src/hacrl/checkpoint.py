"""Checkpoints that a crash can never break, and resume.

Layout of `<output_dir>/checkpoints/step_000010/`:
    agents/<name>/        a plain Hugging Face model directory (safetensors, config, tokenizer, chat template)
    optimizer/<name>.pt   the agent's AdamW state (tensors and numbers only; loaded with weights_only=True)
    rng.pt                torch / CUDA RNG states (tensors only)
    config.yaml           the run's resolved config
    state.json            step, agent names, capability history, data position

A checkpoint is written into `step_000010.tmp/` and renamed when complete, so a directory named `step_*` without
the suffix is always whole; older ones are deleted only after the new one exists.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

_STEP_DIR = re.compile(r"^step_(\d{6,})$")


def checkpoint_root(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest complete checkpoint under `output_dir`, or None."""
    root = checkpoint_root(output_dir)
    if not root.is_dir():
        return None
    done = [p for p in root.iterdir() if _STEP_DIR.match(p.name) and (p / "state.json").is_file()]
    return max(done, key=lambda p: int(_STEP_DIR.match(p.name).group(1)), default=None)


def save_checkpoint(
    output_dir: str | Path, step: int, agents, state: dict[str, Any], *, keep_last: int, config_yaml: str = ""
) -> Path:
    root = checkpoint_root(output_dir)
    final = root / f"step_{step:06d}"
    tmp = root / f"step_{step:06d}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)  # leftover of a crash while writing this very step
    (tmp / "optimizer").mkdir(parents=True)
    for agent in agents:
        agent_dir = tmp / "agents" / agent.name
        agent.model.save_pretrained(agent_dir, safe_serialization=True)
        agent.tokenizer.save_pretrained(agent_dir)
        torch.save(agent.optimizer.state_dict(), tmp / "optimizer" / f"{agent.name}.pt")
    torch.save(_rng_state(), tmp / "rng.pt")
    if config_yaml:
        (tmp / "config.yaml").write_text(config_yaml)
    (tmp / "state.json").write_text(json.dumps(state, indent=1))  # written last: its presence marks "complete"
    if final.exists():  # the same step saved twice (e.g. a resumed run): replace only once the new one is whole
        shutil.rmtree(final)
    os.replace(tmp, final)
    complete = sorted((p for p in root.iterdir() if _STEP_DIR.match(p.name)), key=lambda p: p.name)
    for old in complete[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def read_checkpoint_state(path: str | Path, agent_names: list[str]) -> dict[str, Any]:
    """state.json of a complete checkpoint, checked against the run's agents (before any model loads)."""
    path = Path(path)
    if not (path / "state.json").is_file():
        raise FileNotFoundError(f"{str(path)!r} is not a complete hacrl checkpoint (no state.json)")
    state = json.loads((path / "state.json").read_text())
    if state.get("agents") != agent_names:
        raise ValueError(
            f"checkpoint {str(path)!r} holds agents {state.get('agents')} but the config has "
            f"{agent_names}; resume with the same agents in the same order"
        )
    return state


def agent_weights_dir(path: str | Path, name: str) -> Path:
    """The Hugging Face model directory of agent `name` inside a checkpoint."""
    return Path(path) / "agents" / name


def load_training_state(path: str | Path, agents) -> None:
    """Optimizer and RNG states of a checkpoint (the weights load with the agents from `agent_weights_dir`)."""
    path = Path(path)
    for agent in agents:
        opt_state = torch.load(path / "optimizer" / f"{agent.name}.pt", weights_only=True, map_location=agent.device)
        agent.optimizer.load_state_dict(opt_state)
    rng = torch.load(path / "rng.pt", weights_only=True)
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state
