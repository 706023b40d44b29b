"""`pending.pt`: the fixed-lag pipeline's batches in flight (`trainer.lag` = k > 0), sampled and scored, not yet
trained on; written, read back and checked here, and nowhere else.

After step t the driver holds batches t + 1 .. t + k (`Pending`): every agent's answers (text, the source's log-prob
sum, the agent's own token ids and the log-probs of the weights that sampled them) and their rewards. A checkpoint
holds them in `pending.pt` (tensors, numbers and strings only: read back with `weights_only`, never unpickled as
code), so a resumed run trains on exactly the batches the uninterrupted one would have and samples nothing twice.

The file (`write_pending`, read with `torch.load(weights_only=True)` by `read_pending`):
    {"batches": [{"step": t, "agents": [one per agent, in config order:
        {"trajectories": [[group, text, reward, source, source_logp_sum, source_num_tokens, finish_reason,
                           num_bytes], ...],
         "times": [generate_s, logprobs_s, began, ended],
         "rewards": [...], "timeouts": [row, ...], "errors": [row, ...],
         "rollout": {"step", "prompt_ids", "response_ids", "behaviour" (the rows' log-probs, flat), "lengths"}}
        ]}, ...]}

Its values are checked with every other part of a checkpoint before it is used (`pending_problems`, called by
`hacrl.checkpoint.checkpoint_problems`). A digest proves the bytes are those written, not that they are right: a
file re-digested by hand, or one read with `checkpoint.verify_digests=false`, reached the trainer with a token id past
the vocabulary or a NaN reward and failed steps later as a traceback. Here every value is held to what the
checkpoint's own run allows: its steps (step + 1 .. step + trainer.lag), one entry per agent, prompts_per_step x the
agent's G answers, token ids within the agent's vocabulary (its `config.json` in the checkpoint), rewards finite in
[0, algorithm.r_max], log-probs and each answer's log-prob sum finite and <= 0, prompts no longer than the agent's
max_prompt_tokens, answers no longer than its max_new_tokens; each agent's limits resolved from the checkpoint's
config.yaml by `AgentSettings.resolve`, the rule the run itself used.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from hacrl.errors import CheckpointError, first_line, restoring
from hacrl.messages import OwnRollout, Sampled, ScoreResult, Trajectory

PENDING_FILE = "pending.pt"
FINISH_REASONS = ("eos", "length")


def pending_problems(checkpoint: Path, state: dict[str, Any]) -> list[str]:
    """What is wrong with `checkpoint`'s pending.pt (none: [] or no such file), as messages naming it."""
    file = checkpoint / PENDING_FILE
    if not file.is_file():
        return []
    try:
        data = torch.load(file, weights_only=True)
    except Exception as e:  # noqa: BLE001 - damaged: named (never with torch's advice to unpickle it)
        return [f"{PENDING_FILE} cannot be read ({type(e).__name__}: {first_line(e)})"]
    try:
        run = _RunShape.of(checkpoint, state)
        run.check(data, state["step"])
    except _Bad as e:
        return [f"{PENDING_FILE}: {e}"]
    return []


class _Bad(Exception):
    pass


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise _Bad(message)


def _int(x: Any) -> bool:
    return type(x) is int


def _real(x: Any) -> bool:
    return type(x) in (int, float)


class _RunShape:
    """What the run that wrote a checkpoint allows in its batches in flight (from its config.yaml)."""

    def __init__(self, lag, prompts, groups, max_tokens, r_max, vocab, names, prompt_tokens) -> None:
        self.lag, self.prompts, self.groups, self.max_tokens = lag, prompts, groups, max_tokens
        self.r_max, self.vocab, self.names, self.prompt_tokens = r_max, vocab, names, prompt_tokens

    @classmethod
    def of(cls, checkpoint: Path, state: dict[str, Any]) -> _RunShape:
        from hacrl.config import AgentConfig, RolloutConfig, load_yaml
        from hacrl.config.settings import AgentSettings

        try:
            config = load_yaml((checkpoint / "config.yaml").read_text(encoding="utf-8", errors="replace"), "config")
            trainer, agents = config["trainer"], config["agents"]
            r_max = float(config["algorithm"].get("r_max", 1.0))
            lag, prompts = trainer["lag"], trainer["prompts_per_step"]
            rollout = _entry(RolloutConfig, config["rollout"])
            names = list(state["agents"])
            _need(isinstance(agents, list) and len(agents) == len(names), "the checkpoint's config.yaml has other "
                  "agents")  # fmt: skip
            settings = [AgentSettings.resolve(_entry(AgentConfig, a), rollout) for a in agents]
        except _Bad:
            raise
        except Exception as e:  # noqa: BLE001 - its config.yaml is checked where it is read; here it must just say
            raise _Bad(f"the checkpoint's config.yaml does not say its run's sizes ({type(e).__name__})") from None
        groups = [s.group_size for s in settings]
        max_tokens = [s.max_new_tokens for s in settings]
        prompt_tokens = [s.max_prompt_tokens for s in settings]
        vocab = [_vocabulary(checkpoint / "agents" / name / "config.json") for name in names]
        return cls(lag, prompts, groups, max_tokens, r_max, vocab, names, prompt_tokens)

    def check(self, data: Any, step: int) -> None:
        _need(isinstance(data, dict) and isinstance(data.get("batches"), list), "it holds no list of batches")
        batches = data["batches"]
        steps = [b.get("step") if isinstance(b, dict) else None for b in batches]
        expected = list(range(step + 1, step + 1 + self.lag))
        _need(steps == expected, f"it holds batches {steps}, a step-{step} checkpoint at trainer.lag={self.lag} "
              f"holds {expected}")  # fmt: skip
        for batch in batches:
            agents = batch.get("agents")
            _need(isinstance(agents, list) and len(agents) == len(self.names),
                  f"batch {batch['step']} holds {len(agents) if isinstance(agents, list) else 'no'} agents' answers, "
                  f"the run has {len(self.names)}")  # fmt: skip
            for i, agent in enumerate(agents):
                where = f"agent {self.names[i]!r}'s answers in batch {batch['step']}"
                _need(isinstance(agent, dict), f"{where} are not a record")
                self._agent(i, agent, batch["step"], where)

    def _agent(self, i: int, agent: dict, step: int, where: str) -> None:
        count = self.prompts * self.groups[i]
        rows = agent.get("trajectories")
        _need(isinstance(rows, list) and len(rows) == count,
              f"{where}: {len(rows) if isinstance(rows, list) else 'no'} answers, the run samples "
              f"{self.prompts} prompts x {self.groups[i]} = {count}")  # fmt: skip
        for n, row in enumerate(rows):
            self._trajectory(i, row, f"{where}, answer {n}")
        rewards = agent.get("rewards")
        _need(isinstance(rewards, list) and len(rewards) == count, f"{where}: the rewards do not number {count}")
        for n, r in enumerate(rewards):
            _need(self._reward(r), f"{where}: reward {n} is {r!r}, not a finite number in [0, {self.r_max:g}] "
                  "(algorithm.r_max)")  # fmt: skip
        for key in ("timeouts", "errors"):
            marks = agent.get(key)
            _need(isinstance(marks, list) and all(_int(m) and 0 <= m < count for m in marks),
                  f"{where}: its {key} are not answer indexes")  # fmt: skip
        times = agent.get("times")
        _need(isinstance(times, list) and len(times) == 4 and all(_real(t) and math.isfinite(t) for t in times),
              f"{where}: its timings are not 4 finite numbers")  # fmt: skip
        if "rollout" in agent:
            self._rollout(i, agent["rollout"], step, count, where)

    def _reward(self, r: Any) -> bool:
        return _real(r) and math.isfinite(r) and 0 <= r <= self.r_max

    def _trajectory(self, i: int, row: Any, where: str) -> None:
        _need(isinstance(row, list) and len(row) == 8, f"{where} is not an answer record")
        group, text, reward, source, logp, tokens, finish, size = row
        _need(_int(group) and 0 <= group < self.prompts, f"{where}: prompt {group!r} is not one of the step's")
        _need(isinstance(text, str), f"{where}: its text is not text")
        _need(_real(reward) and (math.isnan(reward) or self._reward(reward)),  # NaN: scored in the batch's rewards
              f"{where}: reward {reward!r} is not a finite number in [0, {self.r_max:g}]")  # fmt: skip
        _need(source == i, f"{where}: it says agent {source!r} sampled it")
        # finite: at trainer.lag >= 1 every row's sum is computed (`LogprobPlan.at_sampling`), and the other
        # learners' foreign ratios read it
        _need(_real(logp) and math.isfinite(logp) and logp <= 1e-3,
              f"{where}: its log-prob sum {logp!r} is not a finite log-probability (<= 0)")  # fmt: skip
        _need(_int(tokens) and 0 <= tokens <= self.max_tokens[i] + 1,  # + 1: an end-of-answer token past the limit
              f"{where}: {tokens!r} tokens, past max_new_tokens={self.max_tokens[i]}")  # fmt: skip
        _need(finish in FINISH_REASONS, f"{where}: finish reason {finish!r} is not one of {FINISH_REASONS}")
        _need(_int(size) and size == len(text.encode("utf-8", "surrogatepass")), f"{where}: {size!r} bytes is not "
              "its text's size")  # fmt: skip

    def _rollout(self, i: int, rollout: Any, step: int, count: int, where: str) -> None:
        _need(isinstance(rollout, dict) and rollout.get("step") == step, f"{where}: its tokens are another step's")
        prompts, responses = rollout.get("prompt_ids"), rollout.get("response_ids")
        _need(isinstance(prompts, list) and len(prompts) == self.prompts, f"{where}: the prompts' tokens do not number "
              f"{self.prompts}")  # fmt: skip
        _need(isinstance(responses, list) and len(responses) == count, f"{where}: the answers' tokens do not number "
              f"{count}")  # fmt: skip
        vocab = self.vocab[i]
        for kind, seqs in (("prompt", prompts), ("answer", responses)):
            for n, ids in enumerate(seqs):
                _need(isinstance(ids, list) and all(_int(t) for t in ids), f"{where}: {kind} {n}'s tokens are not ids")
                bad = [t for t in ids if t < 0 or (vocab is not None and t >= vocab)]
                _need(not bad, f"{where}: {kind} {n} holds token id {bad[:1][0] if bad else ''}, outside the agent's "
                      f"vocabulary (0 .. {vocab - 1 if vocab else '?'}, its config.json)")  # fmt: skip
        for n, ids in enumerate(prompts):  # rendered prompts are cut from the left to the agent's limit
            _need(len(ids) <= self.prompt_tokens[i], f"{where}: prompt {n} has {len(ids)} tokens, past "
                  f"max_prompt_tokens={self.prompt_tokens[i]}")  # fmt: skip
        for n, ids in enumerate(responses):
            _need(len(ids) <= self.max_tokens[i] + 1, f"{where}: answer {n} has {len(ids)} tokens, past "
                  f"max_new_tokens={self.max_tokens[i]}")  # fmt: skip
        lengths, behaviour = rollout.get("lengths"), rollout.get("behaviour")
        _need(lengths == [len(ids) for ids in responses], f"{where}: its log-prob lengths do not match the answers")
        _need(isinstance(behaviour, torch.Tensor) and behaviour.dim() == 1 and behaviour.numel() == sum(lengths),
              f"{where}: its log-probs are not one per answer token")  # fmt: skip
        finite = behaviour.float()
        _need(bool(torch.isfinite(finite).all()) and bool((finite <= 1e-3).all()),
              f"{where}: its log-probs hold a value that is not a finite log-probability (<= 0)")  # fmt: skip


def _entry(cls: type, saved: Any):
    """A config entry (`RolloutConfig`, `AgentConfig`) with the values a checkpoint's config.yaml gives it: a key of
    another hacrl version is left out, one it lacks keeps its default (as a resume compares them)."""
    if not isinstance(saved, dict):
        raise TypeError(f"{cls.__name__} is not a mapping")
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in saved.items() if k in names})


def _vocabulary(config_json: Path) -> int | None:
    """An agent's vocabulary size from its model directory in the checkpoint (None: a frozen agent's part holds no
    model; its token ids are bounded below only)."""
    try:
        size = json.loads(config_json.read_text()).get("vocab_size")
    except (OSError, ValueError, AttributeError):
        return None
    return size if _int(size) and size > 0 else None


@dataclass
class Pending:
    """One batch: every agent's `Sampled` (with its `OwnRollout` under lag) and its `ScoreResult`, in agent order."""

    step: int
    sampled: list[Sampled]
    scored: list[ScoreResult]


def write_pending(directory: Path, pending: list[Pending]) -> None:
    """`pending.pt` in a checkpoint directory being written."""
    torch.save({"batches": [_batch_state(b) for b in pending]}, directory / PENDING_FILE)


def read_pending(checkpoint: str | Path, step: int, lag: int, notice) -> list[Pending]:
    """The batches in flight a resumed run at `trainer.lag` = `lag` takes from a step-`step` checkpoint: steps
    step + 1 .. step + lag. The file was checked with the rest of the checkpoint (`hacrl.inflight`), so it holds the
    batches of the lag its run had; a run resumed at another lag (only with `checkpoint.strict_resume=false`) keeps
    the first `lag` of them and drops the rest, or has the missing ones sampled by its first step, and `notice` says
    which."""
    file = Path(checkpoint) / PENDING_FILE
    if not file.is_file():
        held = []
    else:
        try:
            state = torch.load(file, weights_only=True)
        except Exception as e:  # noqa: BLE001 - changed since it was checked: named, with what to do
            raise CheckpointError(f"{file}: cannot read the batches in flight ({type(e).__name__}: {first_line(e)}); "
                                  "resume from another checkpoint (checkpoint.resume=<dir>)") from None  # fmt: skip
        with restoring(checkpoint, "batches in flight"):
            held = [_batch(b) for b in state["batches"]]
    if len(held) > lag:
        dropped = [b.step for b in held[lag:]]
        notice(f"{file} holds the batches in flight of a trainer.lag={len(held)} run; at trainer.lag={lag} the ones "
               f"for steps {dropped} are dropped (their prompts are never trained on) and "
               f"{'each step samples its own batch' if lag == 0 else 'sampled again later'}")  # fmt: skip
    elif len(held) < lag:
        missing = list(range(step + 1 + len(held), step + 1 + lag))
        notice(
            f"{'the checkpoint holds no batches in flight' if not held else f'{file} holds {len(held)} batches'}; "
            f"at trainer.lag={lag} the first step samples those for steps {missing} with the checkpoint's weights"
        )
    return held[:lag]


def _batch_state(batch: Pending) -> dict[str, Any]:
    return {
        "step": batch.step,
        "agents": [_agent_state(s, r) for s, r in zip(batch.sampled, batch.scored, strict=True)],
    }


def _agent_state(sampled: Sampled, scored: ScoreResult) -> dict[str, Any]:
    rollout = sampled.rollout
    state = {
        "trajectories": [_trajectory_state(t) for t in sampled.trajectories],
        "times": [sampled.generate_s, sampled.logprobs_s, *sampled.span],
        "rewards": list(scored.rewards),
        "timeouts": list(scored.timeouts),
        "errors": list(scored.errors),
    }
    if rollout is not None:
        state["rollout"] = {
            "step": rollout.step,
            "prompt_ids": rollout.prompt_ids,
            "response_ids": rollout.response_ids,
            "behaviour": torch.tensor([x for row in rollout.behaviour_logp for x in row], dtype=torch.float32),
            "lengths": [len(row) for row in rollout.behaviour_logp],
        }
    return state


def _trajectory_state(t: Trajectory) -> list[Any]:
    return [t.group, t.text, t.reward, t.source, t.source_logp_sum, t.source_num_tokens, t.finish_reason, t.num_bytes]


def _batch(state: dict[str, Any]) -> Pending:
    sampled, scored = [], []
    for agent in state["agents"]:
        trajectories = [Trajectory(*row) for row in agent["trajectories"]]
        generate_s, logprobs_s, began, ended = agent["times"]
        rollout = None
        if "rollout" in agent:
            r = agent["rollout"]
            flat, behaviour, start = r["behaviour"].tolist(), [], 0
            for length in r["lengths"]:
                behaviour.append(flat[start : start + length])
                start += length
            rollout = OwnRollout(r["step"], r["prompt_ids"], r["response_ids"], behaviour, trajectories)
        sampled.append(Sampled(trajectories, generate_s, logprobs_s, (began, ended), rollout=rollout))
        scored.append(ScoreResult(agent["rewards"], agent["timeouts"], agent["errors"]))
    return Pending(state["step"], sampled, scored)
