"""The registry and the invariants that tie the algorithms together (spec 4)."""

import pytest
import torch

from hacrl.core import ALGORITHMS, AlgorithmParams, CapabilityTracker, get_algorithm, step_mean_rewards
from tests.core.helpers import Row, grad_of, make_inputs

PARAMS = AlgorithmParams()


def test_registry_names():
    assert sorted(ALGORITHMS) == ["grpo", "gspo", "hacpo", "naive"]
    assert [get_algorithm(n).shares_rollouts for n in ("grpo", "gspo", "naive", "hacpo")] == [False, False, True, True]


def test_unknown_algorithm_lists_the_known_ones():
    with pytest.raises(
        ValueError, match=r"unknown algorithm 'ppo'; known algorithms: \['grpo', 'gspo', 'hacpo', 'naive'\]"
    ):
        get_algorithm("ppo")


def test_sharing_switch():
    off = AlgorithmParams(share_rollouts=False)
    assert get_algorithm("hacpo").pool_is_shared(PARAMS)
    assert not get_algorithm("hacpo").pool_is_shared(off)
    assert not get_algorithm("gspo").pool_is_shared(PARAMS)


def _scored_step(num_agents: int, seed: int):
    """One step's rewards: 4 prompts x G = 4 per agent, plus the per-row learner-side tensors."""
    g = torch.Generator().manual_seed(seed)
    n_rows = 4 * 4 * num_agents
    rewards = torch.randint(0, 2, (n_rows,), generator=g).double()
    source = torch.arange(n_rows) // 16  # agent-major, as the trainer stores them
    group = (torch.arange(n_rows) % 16) // 4
    return rewards, group, source


def _rows_for(learner, rewards, source, adv, seed):
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(rewards.shape[0]):
        if int(source[i]) != learner:
            continue
        rows.append(
            Row(
                length=int(torch.randint(1, 6, (1,), generator=g)),
                new_mean=-1.0 + 0.01 * float(torch.randn(1, generator=g)),
                old_mean=-1.0 + 0.01 * float(torch.randn(1, generator=g)),
                adv=float(adv[i]),
                source=learner,
            )
        )
    return rows


@pytest.mark.parametrize("seed", range(3))
def test_hacpo_with_one_agent_is_gspo(seed):
    rewards, group, source = _scored_step(1, seed)
    tracker = CapabilityTracker(num_agents=1)
    tracker.update(step_mean_rewards(rewards, source, 1))
    caps = tracker.capabilities()
    hacpo, gspo = get_algorithm("hacpo"), get_algorithm("gspo")
    kwargs = {"learner": 0, "capabilities": caps, "params": PARAMS}
    adv_h = hacpo.advantages(rewards, group, source, **kwargs)
    adv_g = gspo.advantages(rewards, group, source, **kwargs)
    assert torch.equal(adv_h, adv_g)
    rows = _rows_for(0, rewards, source, adv_h, seed)
    for m in range(3):
        a, b = make_inputs(rows, capabilities=(1.0,)), make_inputs(rows, capabilities=(1.0,))
        out_h, out_g = hacpo.loss(a, params=PARAMS, step_index=m), gspo.loss(b, params=PARAMS, step_index=m)
        assert torch.equal(out_h.loss, out_g.loss)
        assert torch.equal(grad_of(out_h, a), grad_of(out_g, b))


@pytest.mark.parametrize("num_agents", [2, 3])
def test_hacpo_with_sharing_off_is_gspo_for_every_learner(num_agents):
    rewards, group, source = _scored_step(num_agents, seed=num_agents)
    tracker = CapabilityTracker(num_agents=num_agents)
    tracker.update([0.9, 0.1, 0.5][:num_agents])  # unequal: would matter if anything leaked
    caps = tracker.capabilities()
    off = AlgorithmParams(share_rollouts=False)
    hacpo, gspo = get_algorithm("hacpo"), get_algorithm("gspo")
    assert not hacpo.pool_is_shared(off)
    for learner in range(num_agents):
        own = source == learner  # the pool the trainer builds when sharing is off
        kwargs = {"learner": learner, "capabilities": caps}
        adv_h = hacpo.advantages(rewards[own], group[own], source[own], params=off, **kwargs)
        adv_g = gspo.advantages(rewards[own], group[own], source[own], params=PARAMS, **kwargs)
        assert torch.equal(adv_h, adv_g)
        rows = _rows_for(learner, rewards[own], source[own], adv_h, learner)
        a = make_inputs(rows, learner=learner, capabilities=caps.tolist())
        b = make_inputs(rows, learner=learner, capabilities=caps.tolist())
        out_h, out_g = hacpo.loss(a, params=off, step_index=2), gspo.loss(b, params=PARAMS, step_index=2)
        assert torch.equal(out_h.loss, out_g.loss)
        assert torch.equal(grad_of(out_h, a), grad_of(out_g, b))


def test_own_only_advantages_refuse_a_shared_pool():
    rewards, group, source = _scored_step(2, seed=0)
    with pytest.raises(ValueError, match="grpo/gspo advantages take the learner's own responses only"):
        get_algorithm("gspo").advantages(
            rewards, group, source, learner=0, capabilities=torch.ones(2, dtype=torch.float64), params=PARAMS
        )


def test_naive_and_hacpo_advantages_through_the_registry():
    rewards, group, source = _scored_step(2, seed=1)
    caps = torch.tensor([0.6, 0.3], dtype=torch.float64)
    naive = get_algorithm("naive").advantages(rewards, group, source, learner=1, capabilities=caps, params=PARAMS)
    hacpo = get_algorithm("hacpo").advantages(rewards, group, source, learner=1, capabilities=caps, params=PARAMS)
    ablated = get_algorithm("hacpo").advantages(
        rewards, group, source, learner=1, capabilities=caps, params=AlgorithmParams(capability_baseline=False)
    )
    assert torch.equal(naive, ablated)
    assert not torch.equal(naive, hacpo)  # the capability baseline changes something in this pool
