"""`hacrl plan CONFIG --devices N`: how to place the agents on N GPUs (which agent on how many devices, FSDP2 groups
where one device is too small or too slow) and their rollout budgets, from a time model. A model, not a
measurement: every constant below names the measurement it comes from; `hacrl plan --measure` times the real run.

Per agent j on K_j devices (each rank holds a whole compute copy and samples its share of the rows, and FSDP2
splits the update's rows; `hacrl.agent.learning`), with R_j its rows per generation call per rank (the memory plan's
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
import math
from dataclasses import dataclass, replace

from hacrl.config import TrainConfig
from hacrl.driver.pace import Costs, Prediction, predict, propose, run_shape

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


EXHAUSTIVE_SPLITS = 20_000
"""Up to this many splits of the devices (C(N, agents)) are all tried; beyond it, a greedy search (each step gives
one more device to the agent whose extra device shortens the predicted step most)."""


def agent_costs(config: TrainConfig, i: int, k: int, device_memory: float | None) -> tuple[float, float] | None:
    """(seconds per answer sampled, per row trained) of agent i on k GPUs; None when it does not fit there."""
    from hacrl.config.settings import AgentSettings
    from hacrl.tools.plan import plan

    agent = config.agents[i]
    one = copy.deepcopy(config)
    one.agents = [one.agents[i]]
    one.agents[0].devices = [f"cuda:{r}" for r in range(k)] if k > 1 else None
    one.agents[0].device = "cuda:0"
    (p,) = plan(one, device_memory=device_memory)
    if p.fits is False or not p.rows:
        return None
    settings = AgentSettings.resolve(agent, config.rollout)
    length, prompt = settings.max_new_tokens, min(PROMPT_TOKENS, settings.max_prompt_tokens)
    weights = p.shape.params * p.shape.dtype_bytes
    step = (weights + p.rows * (prompt + length / 2) * p.shape.kv_bytes_per_token) / DECODE_BYTES_PER_S
    per_row = 6 * p.shape.params * (prompt + length) / (k * TRAIN_FLOPS_PER_S) * (not agent.frozen)
    return length * step / (p.rows * k), per_row


def modelled_costs(config: TrainConfig, devices: list[int], device_memory: float | None, *,
                   cache: dict | None = None) -> Costs | None:  # fmt: skip
    """The time model's costs with agent j on `devices[j]` GPUs; None when an agent does not fit there. `cache`
    keeps each (agent, devices)'s `agent_costs` across calls."""
    cache = {} if cache is None else cache
    for key in enumerate(devices):
        if key not in cache:
            cache[key] = agent_costs(config, *key, device_memory)
    if any(cache[key] is None for key in enumerate(devices)):
        return None
    return replace(run_shape(config, concurrent=True), per_answer=[cache[key][0] for key in enumerate(devices)],
                   per_row=[cache[key][1] for key in enumerate(devices)], scoring=SCORING_S_PER_ANSWER)  # fmt: skip


def _splits(num_devices: int, most: list[int]):
    """Every split of at most `num_devices` devices giving agent j 1..most[j] (each agent at least one)."""
    if not most:
        yield []
        return
    for k in range(1, min(most[0], num_devices - len(most) + 1) + 1):
        for rest in _splits(num_devices - k, most[1:]):
            yield [k, *rest]


def place(config: TrainConfig, num_devices: int, device_memory: float | None, *, slack: float = 0.1):
    """(the splits tried, best first: (devices per agent, prediction at equal budgets); the chosen placement with
    its proposed budgets, or None when no split fits). Each (agent, devices) is planned once."""
    n = len(config.agents)
    most = [1 if a.frozen or a.lora is not None else num_devices for a in config.agents]  # LoRA, frozen: one device
    cache: dict = {}
    tried: dict[tuple[int, ...], tuple[Costs, Prediction]] = {}

    def attempt(split: list[int]) -> Prediction | None:
        if tuple(split) not in tried:
            costs = modelled_costs(config, split, device_memory, cache=cache)
            if costs is None:
                return None
            tried[tuple(split)] = (costs, predict(costs, costs.group_sizes))
        return tried[tuple(split)][1]

    if n <= num_devices and math.comb(num_devices, n) <= EXHAUSTIVE_SPLITS:
        for split in _splits(num_devices, most):
            attempt(split)
    else:

        def fits(j: int, k: int) -> bool:
            if (j, k) not in cache:
                cache[(j, k)] = agent_costs(config, j, k, device_memory)
            return cache[(j, k)] is not None

        _greedy(num_devices, most, fits, attempt)
    if not tried:
        return [], None
    ranked = sorted(tried.items(), key=lambda t: (round(t[1][1].step, 6), sum(t[0])))
    split, (costs, equal) = ranked[0]
    return [(list(s), p) for s, (_, p) in ranked], Placement(list(split), costs, equal,
                                                             propose(costs, slack=slack)[1])  # fmt: skip


def _greedy(num_devices: int, most: list[int], fits, attempt) -> None:
    """Each agent on the fewest devices it fits on (`fits(j, k)`), then one device at a time to the agent whose extra
    device shortens the predicted step most, while that helps."""
    split = []
    for j, limit in enumerate(most):
        k = next((k for k in range(1, limit + 1) if fits(j, k)), None)
        if k is None:
            return
        split.append(k)
    if sum(split) > num_devices or (best := attempt(split)) is None:
        return
    while sum(split) < num_devices:
        options = [(p.step, j) for j in range(len(split)) if split[j] < most[j]
                   and (p := attempt([*split[:j], split[j] + 1, *split[j + 1 :]])) is not None]  # fmt: skip
        if not options or min(options)[0] >= best.step:
            return
        split[min(options)[1]] += 1
        best = attempt(split)


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
