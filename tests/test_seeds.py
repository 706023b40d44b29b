"""Every random stream of a run comes from `hacrl.seeds`, and no two streams of a run share a seed."""

from __future__ import annotations

import pytest

from hacrl import seeds


@pytest.mark.parametrize(("seed", "ranks"), [(0, 1), (1, 1), (7, 4), (2**40 - 1, 8)])
def test_the_streams_of_a_run_are_pairwise_distinct(seed, ranks):
    """Also with every agent on `ranks` ranks (agents.<i>.devices): rank r > 0 draws from a stream of its own."""
    streams = seeds.streams(
        seed, agents=8, steps=300, epochs=100, splits=("", "math500", "aime24", "gsm8k"), ranks=ranks
    )
    assert len(streams) == 8 * 2 + 8 * (ranks - 1) + 100 + 301 * 4 * 8 * ranks
    by_value: dict[int, list[tuple]] = {}
    for name, value in streams.items():
        by_value.setdefault(value, []).append(name)
    assert [names for names in by_value.values() if len(names) > 1] == []
    assert all(0 <= v < 2**64 for v in by_value)  # what torch.manual_seed takes


def test_the_old_collision_is_gone():
    """The earlier formula gave agent 0's sampled evaluation of the second split at step 0 its training seed (and
    agent 1's the seed of agent 0's new adapters)."""
    assert seeds.evaluation(0, 0, "math500", 0) != seeds.training(0, 0)
    assert seeds.evaluation(0, 0, "math500", 1) != seeds.adapters(0, 0)
    # the kept formulas: published runs and checkpoints of earlier versions keep their numbers
    assert [seeds.training(3, a) for a in range(2)] == [3 * 1_000_003 + 7_919, 3 * 1_000_003 + 2 * 7_919]
    assert seeds.adapters(3, 1) == seeds.training(3, 1) + 1 and seeds.prompts(3, 2) == 3 * 100_003 + 2
    # an evaluation stream is keyed by the split's name, not its position
    assert seeds.evaluation(0, 5, "math500", 1) == seeds.evaluation(0, 5, "math500", 1)
    assert len({seeds.evaluation(0, 5, s, 1) for s in ("", "math500", "aime24")}) == 3
    # rank 0 of a worker group keeps the agent's stream: K = 1 runs are unchanged
    assert seeds.rank(seeds.training(3, 1), 0) == seeds.training(3, 1)


@pytest.mark.parametrize("seed", [0, 1, 7, 2**40 - 1])
def test_hacrl_controls_own_streams_are_none_of_a_runs(seed):
    """`seeds.control` (a learned mapping's per policy, the replay draw): distinct from each other and from every
    stream of a run with the same seed (training, adapters, prompts, evaluation, ranks)."""
    own = [seeds.control(seed, "mapping", k) for k in range(8)] + [seeds.control(seed, "replay")]
    run = set(seeds.streams(seed, agents=8, steps=50, epochs=10, splits=("",), ranks=2).values())
    assert len(set(own)) == len(own) and not set(own) & run
    assert all(2**60 <= v < 2**61 for v in own)
