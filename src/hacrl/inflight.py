"""`pending.pt`, a lag-k checkpoint's batches in flight, checked for its values as every other part of a checkpoint
is checked before use (`hacrl.checkpoint.checkpoint_problems`).

The file (written by `hacrl.driver.pipeline.write_pending`, read with `torch.load(weights_only=True)`):
    {"batches": [{"step": t, "agents": [one per agent, in config order:
        {"trajectories": [[group, text, reward, source, source_logp_sum, source_num_tokens, finish_reason,
                           num_bytes], ...],
         "times": [generate_s, logprobs_s, began, ended],
         "rewards": [...], "timeouts": [row, ...], "errors": [row, ...],
         "rollout": {"step", "prompt_ids", "response_ids", "behaviour" (the rows' log-probs, flat), "lengths"}}
        ]}, ...]}

A digest proves the bytes are those written, not that they are right: a file re-digested by hand, or one read with
`checkpoint.verify_digests=false`, reached the trainer with a token id past the vocabulary or a NaN reward and
failed steps later as a traceback. Here every value is held to what the checkpoint's own run allows: its steps
(step + 1 .. step + trainer.lag), one entry per agent, prompts_per_step x the agent's G answers, token ids within
the agent's vocabulary (its `config.json` in the checkpoint), rewards finite in [0, algorithm.r_max], log-probs
and each answer's log-prob sum finite and <= 0, prompts no longer than the agent's max_prompt_tokens, answers no
longer than its max_new_tokens.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

PENDING_FILE = "pending.pt"
FINISH_REASONS = ("eos", "length")


def pending_problems(checkpoint: Path, state: dict[str, Any]) -> list[str]:
    """What is wrong with `checkpoint`'s pending.pt (none: [] or no such file), as messages naming it."""
    file = checkpoint / PENDING_FILE
    if not file.is_file():
        return []
    import torch

    try:
        data = torch.load(file, weights_only=True)
    except Exception as e:  # noqa: BLE001 - damaged: named (never with torch's advice to unpickle it)
        from hacrl.errors import first_line

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
        from hacrl.config import load_yaml

        try:
            config = load_yaml((checkpoint / "config.yaml").read_text(encoding="utf-8", errors="replace"), "config")
            trainer, rollout, agents = config["trainer"], config["rollout"], config["agents"]
            r_max = float(config["algorithm"].get("r_max", 1.0))
            lag, prompts = trainer["lag"], trainer["prompts_per_step"]
        except Exception as e:  # noqa: BLE001 - its config.yaml is checked where it is read; here it must just say
            raise _Bad(f"the checkpoint's config.yaml does not say its run's sizes ({type(e).__name__})") from None
        names = list(state["agents"])
        _need(isinstance(agents, list) and len(agents) == len(names), "the checkpoint's config.yaml has other agents")
        groups = [a.get("group_size") or rollout["group_size"] for a in agents]
        max_tokens = [a.get("max_new_tokens") or rollout["max_new_tokens"] for a in agents]
        prompt_tokens = [a.get("max_prompt_tokens") or rollout.get("max_prompt_tokens", 512) for a in agents]
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
        # finite: at trainer.lag >= 1 every row's sum is computed (`_rows_needing_old_logprobs`), and the other
        # learners' foreign ratios read it
        _need(_real(logp) and math.isfinite(logp) and logp <= 1e-3,
              f"{where}: its log-prob sum {logp!r} is not a finite log-probability (<= 0)")  # fmt: skip
        _need(_int(tokens) and 0 <= tokens <= self.max_tokens[i] + 1,  # + 1: an end-of-answer token past the limit
              f"{where}: {tokens!r} tokens, past max_new_tokens={self.max_tokens[i]}")  # fmt: skip
        _need(finish in FINISH_REASONS, f"{where}: finish reason {finish!r} is not one of {FINISH_REASONS}")
        _need(_int(size) and size == len(text.encode("utf-8", "surrogatepass")), f"{where}: {size!r} bytes is not "
              "its text's size")  # fmt: skip

    def _rollout(self, i: int, rollout: Any, step: int, count: int, where: str) -> None:
        import torch

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


def _vocabulary(config_json: Path) -> int | None:
    """An agent's vocabulary size from its model directory in the checkpoint (None: a frozen agent's part holds no
    model; its token ids are bounded below only)."""
    try:
        size = json.loads(config_json.read_text()).get("vocab_size")
    except (OSError, ValueError, AttributeError):
        return None
    return size if _int(size) and size > 0 else None
