"""Every random stream of a training run, derived from the run's seed (`trainer.seed`) here and nowhere else.

| stream | drives | derived from |
| --- | --- | --- |
| `training(seed, agent)` | the agent worker's torch RNG: sampling, dropout (saved in checkpoints) | seed, agent |
| `adapters(seed, agent)` | the initialisation of new LoRA adapters | seed, agent |
| `prompts(seed, epoch)` | the order of the training prompts in an epoch | seed, epoch |
| `evaluation(seed, step, split, agent)` | sampled evaluation of one agent on one split at one step | all four |
| `rank(stream, r)` | rank r > 0 of an agent's worker group (`agents.<i>.devices`): its share of that stream | both |
| `control(seed, what, policy)` | `hacrl control`'s own: a learned mapping (`mapping`), the replay draw | all |

`hacrl control` draws from the same streams, policy i for agent i: `training` drives its actions, `adapters` the
initialisation of its weights (unless `policies.<i>.init_seed` names one), `prompts(seed, 0)` its initial states.

The first three keep the formulas of the runs already published (a number in `benchmarks/` reproduces); they are
pairwise distinct for any run with fewer than 126 agents and fewer than 7,919 epochs. Evaluation seeds are a hash
of their four parts with bit 62 set, so they can equal none of the others (which stay below 2**62 for any seed
below 2**40) and none of each other's, whatever the steps, splits and agents: evaluating can never replay a
training stream. Rank r > 0 of a worker group draws from `rank(stream, r)`, a hash with bit 61 set and bit 62
clear: none of the above, and rank 0 keeps the agent's own stream (so K = 1 is today's run). (An earlier formula
gave agent 0's sampled evaluation of the second split at step 0 agent 0's training seed.) `streams` lists a run's
streams by name, for the test that they are distinct.

The testbed's warm-start (`hacrl bootstrap`) is a separate process with its own streams: `warm_start` below.
"""

from __future__ import annotations

import hashlib

__all__ = ["adapters", "control", "evaluation", "prompts", "rank", "streams", "training", "warm_start"]

_EVAL_BIT = 1 << 62
_RANK_BIT = 1 << 61
_CONTROL_BIT = 1 << 60


def training(seed: int, agent: int) -> int:
    """Agent `agent`'s own random stream (sampling, dropout) in a run seeded `seed`."""
    return seed * 1_000_003 + 7_919 * (agent + 1)


def adapters(seed: int, agent: int) -> int:
    """The stream that initialises agent `agent`'s new LoRA adapters."""
    return training(seed, agent) + 1


def prompts(seed: int, epoch: int) -> int:
    """The permutation of the training prompts in epoch `epoch`."""
    return seed * 100_003 + epoch


def evaluation(seed: int, step: int, split: str, agent: int) -> int:
    """Sampled evaluation of agent `agent` on split `split` ('' for the task's eval split, else the benchmark's
    name) at step `step`. Keyed by the split's name, so adding a benchmark moves no other split's samples."""
    digest = hashlib.blake2b(f"evaluation\0{seed}\0{step}\0{split}\0{agent}".encode(), digest_size=8).digest()
    return _EVAL_BIT | (int.from_bytes(digest, "little") & (_EVAL_BIT - 1))


def rank(stream: int, r: int) -> int:
    """Rank `r`'s stream of a worker group whose rank 0 draws from `stream` (the agent's training stream, or an
    evaluation stream): `stream` itself for r = 0, else a hash of both with bit 61 set and bit 62 clear."""
    if r == 0:
        return stream
    digest = hashlib.blake2b(f"rank\0{stream}\0{r}".encode(), digest_size=8).digest()
    return _RANK_BIT | (int.from_bytes(digest, "little") & (_RANK_BIT - 1))


def control(seed: int, what: str, policy: int = 0) -> int:
    """A stream of `hacrl control`'s own (`what`: `mapping`, policy `policy`'s learned mapping: its initial weights
    and its batches; `replay`, the draw from the experience buffers): a hash with bit 60 set and bits 61-62 clear,
    so none of the streams above (for any seed below 2**40)."""
    digest = hashlib.blake2b(f"control\0{seed}\0{what}\0{policy}".encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") & (_CONTROL_BIT - 1)) | _CONTROL_BIT


def streams(
    seed: int, *, agents: int, steps: int, epochs: int, splits: tuple[str, ...] = ("",), ranks: int = 1
) -> dict[tuple, int]:
    """Every stream of a run of `agents` agents (each on `ranks` ranks), `steps` steps and `epochs` epochs over the
    prompts, evaluated on `splits` at every step, by name: {("training", agent): seed, ...}."""
    out: dict[tuple, int] = {}
    for a in range(agents):
        out["training", a] = training(seed, a)
        out["adapters", a] = adapters(seed, a)
        for r in range(1, ranks):
            out["training", a, "rank", r] = rank(training(seed, a), r)
    for e in range(epochs):
        out["prompts", e] = prompts(seed, e)
    for step in range(steps + 1):
        for split in splits:
            for a in range(agents):
                out["evaluation", step, split, a] = evaluation(seed, step, split, a)
                for r in range(1, ranks):
                    out["evaluation", step, split, a, "rank", r] = rank(evaluation(seed, step, split, a), r)
    return out


def warm_start(base: int, benchmark_seed: int) -> int:
    """A testbed agent's warm-start seed (its initialisation and its SFT batch order) for benchmark seed
    `benchmark_seed`, from its recipe's base seed (1, 2, 3 ...): each benchmark seed moves every agent's."""
    return base + 1000 * benchmark_seed
