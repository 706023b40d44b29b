"""`hacrl plan CONFIG --devices N`: how to place the agents on N GPUs (which agent on how many devices, FSDP2 groups
where one device is too small or too slow) and their rollout budgets, from a time model. A model, not a
measurement: every constant below names the measurement it comes from; `hacrl plan --measure` times the real run.

Per agent j on K_j devices (each rank holds a whole compute copy and samples its share of the rows, and FSDP2
splits the update's rows; `hacrl.agent.sharded`), with R_j its rows per generation call per rank (the memory plan's
`batch_size: auto` on that device), L its response limit and p the prompt length:

    one decode step     (weight bytes + R_j x (p + L/2) x KV bytes per token) / DECODE_BYTES_PER_S
    sampling, per answer  L x decode step / (R_j x K_j)          (every answer runs to the limit: the worst case)
    update, per row       6 x parameters x (p + L) / (K_j x TRAIN_FLOPS_PER_S)
    scoring, per answer   SCORING_S_PER_ANSWER

These make the `Costs` of `hacrl.tools.budgets`, whose lockstep model (max sampling + scoring + max update) and
budget proposal are the same as for measured costs. The placement is the split of the N devices (each agent at
least the devices its memory plan needs) with the shortest predicted step at equal budgets; budgets then fill
what waiting is left in sampling.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass

from hacrl.config import TrainConfig
from hacrl.tools.budgets import Costs, Prediction, predict, propose

DECODE_BYTES_PER_S = 1.65e12
"""Bytes a decode step reads per second: benchmarks/results/gpu-h100-paper-step.md, the Qwen3-4B shape on an H100
with the static sampler and CUDA graphs at 16 rows per call: 8.1 ms per step reading 8.04 GB of bf16 weights and
5.3 GB of keys and values (16 rows x 2,252 filled positions x 147 KB): 1.65 TB/s, 49 % of the HBM roofline."""

TRAIN_FLOPS_PER_S = 0.200 * 989.4e12
"""FLOP/s of an update counted as 6 x parameters x tokens: the same file's update, 261,114 tokens in 31.8 s,
MFU 20.0 % of the H100's 989.4 TFLOP/s (bf16 dense), gradient checkpointing on."""

SCORING_S_PER_ANSWER = 2.3 / 64
"""Seconds of scoring per answer: the same file's step, 64 answers of up to 4,096 tokens scored in 2.3 s."""

PROMPT_TOKENS = 256
"""Prompt length p when the config's limit is longer: a MATH problem in a chat template is ~100-300 tokens."""


@dataclass
class Placement:
    devices: list[int]
    """K_j: devices per agent."""
    costs: Costs
    equal: Prediction
    proposed: Prediction


def modelled_costs(config: TrainConfig, devices: list[int], device_memory: float | None) -> Costs | None:
    """The time model's costs with agent j on `devices[j]` GPUs; None when an agent does not fit there."""
    from hacrl.config.settings import AgentSettings
    from hacrl.core import get_algorithm
    from hacrl.tools.plan import plan

    per_answer, per_row = [], []
    for i, (agent, k) in enumerate(zip(config.agents, devices, strict=True)):
        one = copy.deepcopy(config)
        one.agents = [one.agents[i]]
        one.agents[0].devices = [f"cuda:{r}" for r in range(k)] if k > 1 else None
        one.agents[0].device = "cuda:0"
        (p,) = plan(one, device_memory=device_memory)
        if p.fits is False or not p.rows:
            return None
        settings = AgentSettings.resolve(agent, config.rollout, config.trainer)
        length, prompt = settings.max_new_tokens, min(PROMPT_TOKENS, settings.max_prompt_tokens)
        weights = p.shape.params * p.shape.dtype_bytes
        step = (weights + p.rows * (prompt + length / 2) * p.shape.kv_bytes_per_token) / DECODE_BYTES_PER_S
        per_answer.append(length * step / (p.rows * k))
        per_row.append(6 * p.shape.params * (prompt + length) / (k * TRAIN_FLOPS_PER_S) * (not agent.frozen))
    names = [a.name for a in config.agents]
    return Costs(
        names=names, per_answer=per_answer, per_row=per_row, scoring=SCORING_S_PER_ANSWER,
        group_sizes=[AgentSettings.resolve(a, config.rollout, config.trainer).group_size for a in config.agents],
        shared=get_algorithm(config.algorithm.name).pool_is_shared(config.algorithm) and len(names) > 1,
        learns=[not a.frozen for a in config.agents], prompts=config.trainer.prompts_per_step,
        mini_batch_size=config.trainer.mini_batch_size, concurrent=True, foreign_cap=config.sharing.budget_per_prompt,
    )  # fmt: skip


def place(config: TrainConfig, num_devices: int, device_memory: float | None, *, slack: float = 0.1):
    """(the splits tried, best first: (devices per agent, prediction at equal budgets); the chosen placement with
    its proposed budgets, or None when no split fits)."""
    n = len(config.agents)
    single = [a.frozen or a.lora is not None for a in config.agents]  # LoRA and frozen agents: one device
    tried = []
    for split in itertools.product(range(1, num_devices + 1), repeat=n):
        if sum(split) > num_devices or any(k > 1 and s for k, s in zip(split, single, strict=True)):
            continue
        costs = modelled_costs(config, list(split), device_memory)
        if costs is not None:
            tried.append((list(split), costs, predict(costs, costs.group_sizes)))
    if not tried:
        return [], None
    tried.sort(key=lambda t: (round(t[2].step, 6), sum(t[0])))
    split, costs, equal = tried[0]
    return [(s, p) for s, _, p in tried], Placement(split, costs, equal, propose(costs, slack=slack)[1])


def render(config: TrainConfig, num_devices: int, tried, chosen: Placement | None) -> str:
    names = [a.name for a in config.agents]
    if chosen is None:
        return f"no split of {num_devices} devices fits every agent (see `hacrl plan CONFIG` for memory)"
    head = f"time model on {num_devices} GPUs (a model, not a measurement: hacrl.tools.placement names its sources)"
    lines = [head, "", f"{'devices per agent':<28}{'step s':>9}{'idle':>7}{'answers/s':>11}"]
    for split, p in tried[:8]:
        label = ", ".join(f"{n} {k}" for n, k in zip(names, split, strict=True))
        lines.append(f"{label:<28}{p.step:>9.1f}{100 * p.idle_frac:>6.0f}%{p.answers_per_second:>11.2f}")
    even = next((e for split, e in tried if split == [num_devices // len(names)] * len(names)), None)
    if even is not None:
        lines += ["", f"even split ({num_devices // len(names)} each), equal budgets: step {even.step:.1f} s, idle "
                  f"{100 * even.idle_frac:.0f} %, {even.answers_per_second:.2f} answers/s"]  # fmt: skip
    p = chosen.proposed
    lines += [""] if even is None else []
    lines += ["chosen: " + ", ".join(f"{n} on {k}" for n, k in zip(names, chosen.devices, strict=True)),
              f"  equal budgets: step {chosen.equal.step:.1f} s, idle {100 * chosen.equal.idle_frac:.0f} %, "
              f"{chosen.equal.answers_per_second:.2f} answers/s",
              f"  with budgets {'/'.join(map(str, p.group_sizes))}: step {p.step:.1f} s, idle "
              f"{100 * p.idle_frac:.0f} %, {p.answers_per_second:.2f} answers/s"]  # fmt: skip
    settings, first = [], 0
    for j, k in enumerate(chosen.devices):
        ranks = [f"cuda:{r}" for r in range(first, first + k)]
        settings.append(f"agents.{j}.devices=[{','.join(ranks)}]" if k > 1 else f"agents.{j}.device={ranks[0]}")
        first += k
    sizes = zip(p.group_sizes, chosen.costs.group_sizes, strict=True)
    settings += [f"agents.{j}.group_size={g}" for j, (g, g0) in enumerate(sizes) if g != g0]
    lines.append("set: " + " ".join(settings))
    return "\n".join(lines)
