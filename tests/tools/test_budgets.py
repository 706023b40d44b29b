"""`hacrl plan --measure` (issue 58, 3): the time model of a lockstep step by hand, the budgets it proposes with and
without sharing, and the command on a real config."""

from __future__ import annotations

import pytest

from hacrl.tools.budgets import Costs, predict, propose


def _costs(shared: bool, **kw) -> Costs:
    """Agent a samples at 0.1 s per answer and learns at 0.01 s per row; agent b is 4x faster at both."""
    fields = dict(names=["a", "b"], group_sizes=[8, 8], per_answer=[0.1, 0.025], per_row=[0.01, 0.0025], scoring=0.0,
                  shared=shared, learns=[True, True], prompts=4, mini_batch_size=4, concurrent=True)  # fmt: skip
    return Costs(**{**fields, **kw})


def test_the_time_model_by_hand():
    """B = 4, G = 8 each. Sampling: a 0.1 x 32 = 3.2 s, b 0.8 s. Shared pools of 16 per prompt: updates a 0.01 x 64
    = 0.64 s, b 0.16 s. Step 3.84 s; idle (2.4 + 0.48) / (2 x 3.84) = 0.375; 64 answers / 3.84 s."""
    p = predict(_costs(shared=True), [8, 8])
    assert p.sampling == pytest.approx([3.2, 0.8]) and p.update == pytest.approx([0.64, 0.16])
    assert p.step == pytest.approx(3.84) and p.idle_frac == pytest.approx(0.375)
    assert p.answers_per_second == pytest.approx(64 / 3.84)
    alone = predict(_costs(shared=False, scoring=0.01), [8, 8])  # own pools; scoring 0.01 s x 64 answers
    assert alone.update == pytest.approx([0.32, 0.08]) and alone.step == pytest.approx(3.2 + 0.64 + 0.32)


def test_without_sharing_the_fast_agent_gets_four_times_the_answers_and_nothing_waits():
    now, proposed = propose(_costs(shared=False))
    assert proposed.group_sizes == [8, 32]
    assert proposed.step == pytest.approx(now.step) and proposed.idle_frac == pytest.approx(0.0)
    assert proposed.answers_per_second == pytest.approx(2.5 * now.answers_per_second)


def test_with_sharing_every_added_answer_lengthens_the_slowest_update_so_the_slack_decides():
    """Each answer per prompt b adds lengthens a's update by 0.01 x 4 = 0.04 s; 10 % of 3.84 s allows 9 of them
    (b's sampling, 0.1 s per answer per prompt, stays under a's 3.2 s up to G = 32). Without a sharing budget the
    proposal also tries one: with sharing.budget_per_prompt=8 (what each learner takes of the other today) a's
    update stays 0.64 s, b grows to 32 within today's step (4 x 40 / 3.84 = 41.7 answers per second against
    4 x 25 / 4.2 = 23.8): proposed with the budget."""
    pool_sized = _costs(shared=True, foreign_cap=1000)  # a budget larger than any pool: it bounds nothing
    now, proposed = propose(pool_sized)
    assert proposed.group_sizes == [8, 17] and proposed.step <= 1.1 * now.step and proposed.foreign_cap == 1000
    assert propose(pool_sized, slack=0.0)[1].group_sizes == [8, 8]
    assert propose(pool_sized, slack=1.0)[1].group_sizes == [8, 32]  # sampling ends with a's
    now, budgeted = propose(_costs(shared=True))
    assert (budgeted.group_sizes, budgeted.foreign_cap) == ([8, 32], 8) and budgeted.step == pytest.approx(now.step)
    assert budgeted.answers_per_second == pytest.approx(4 * 40 / 3.84)


def test_budgets_grow_by_whole_mini_batches():
    now, proposed = propose(_costs(shared=False, mini_batch_size=32))  # B x G a multiple of 32: G in steps of 8
    assert proposed.group_sizes == [8, 32]
    assert propose(_costs(shared=False, mini_batch_size=64))[1].group_sizes == [8, 32]
    assert propose(_costs(shared=False, mini_batch_size=48))[1].group_sizes == [8, 24]


@pytest.mark.slow
def test_plan_measure_times_the_real_config_and_prints_the_settings(tiny_agents, tmp_path, capsys):
    from hacrl.tools.cli import main
    from tests.conftest import fails_cleanly, pair_config

    cfg = pair_config(tiny_agents, tmp_path, algorithm={"name": "gspo"})
    assert main(["plan", str(cfg), "--measure", "--runs", "2"]) == 0
    out = capsys.readouterr().out
    assert "(run 2 of 2)" in out and "between the 2 measurements (each its own run)" in out
    assert "measured (steps 2-4 of 4 of each of 2 runs on this machine, medians; B = 2 prompts per step)" in out
    assert "varies" in out and "predicted from one step's costs alone" in out
    assert "answers per second" in out and ("set: agents." in out or "no budget change" in out)
    assert not (tmp_path / "run").exists()  # measured in a temporary directory
    fails_cleanly(capsys, ["plan", str(cfg), "--measure", "--slack", "-1"], "--slack -1.0")
    fails_cleanly(capsys, ["plan", str(cfg), "--measure", "--runs", "0"], "--runs 0")
    one = "agents=[{name: a, model: " + str(tiny_agents["llama"]) + "}]"
    fails_cleanly(capsys, ["plan", str(cfg), "--measure", one], "has one agent")


def test_a_sharing_budget_keeps_the_slow_learners_update_from_growing_so_the_fast_agent_fills_its_wait():
    """`sharing.budget_per_prompt: 8`: a trains on its 8 + at most 8 of b's answers per prompt, b on its own + 8 of
    a's. With G = (8, 32): a's update 0.01 x 4 x 16 = 0.64 s (as with 8 / 8), b's 0.0025 x 4 x 40 = 0.4 s; so the
    proposal reaches b's sampling limit (32) at an unchanged step, where without the budget the slack stopped it
    at 17."""
    capped = _costs(shared=True, foreign_cap=8)
    p = predict(capped, [8, 32])
    assert p.update == pytest.approx([0.64, 0.4]) and p.step == pytest.approx(3.84)
    now, proposed = propose(capped)
    assert proposed.group_sizes == [8, 32] and proposed.step == pytest.approx(now.step)
    assert proposed.answers_per_second == pytest.approx(2.5 * now.answers_per_second)


@pytest.mark.parametrize(
    "budget, groups", [(None, None), (3, None), (2, [["a", "b"], ["c"]]), (None, [["a", "b"], ["c"]])]
)
def test_the_predicted_pools_are_what_the_run_trains_on_with_budgets_and_groups(budget, groups):
    """`plan --measure` (`predict`), `hacrl plan`'s pool lines and the run's selection (`keep_mask`) read one rule
    (`foreign_per_prompt`): under `sharing.policy: all` each learner's predicted update rows are the rows the run
    keeps, with a budget and with groups (`plan --measure` ignored `sharing.groups`: with a budget of 2 it predicted
    a and b would each train on c's 8 answers a prompt, the run takes 2 of them)."""
    from types import SimpleNamespace

    import torch

    from hacrl.agent.sharing import keep_mask
    from hacrl.config import SharingConfig
    from hacrl.tools.budgets import sharing_terms

    sizes, prompts, names = [4, 2, 8], 3, ["a", "b", "c"]
    config = SimpleNamespace(sharing=SharingConfig(budget_per_prompt=budget, groups=groups),
                             agents=[SimpleNamespace(name=n) for n in names])  # fmt: skip
    costs = Costs(names=names, group_sizes=sizes, per_answer=[0.0] * 3, per_row=[1.0] * 3, scoring=0.0,
                  shared=True, learns=[True] * 3, prompts=prompts, mini_batch_size=1, concurrent=True,
                  **sharing_terms(config))  # fmt: skip
    generator = torch.Generator().manual_seed(0)
    pool = [SimpleNamespace(reward=float(torch.rand((), generator=generator) > 0.5), group=p, source=j)
            for j, g in enumerate(sizes) for p in range(prompts) for _ in range(g)]  # fmt: skip
    adv = torch.randn(len(pool), generator=generator).tolist()
    kept = [sum(keep_mask(pool, adv, torch.ones(3), learner=k, sharing=config.sharing, r_max=1.0, relevance=None,
                          names=names)) for k in range(3)]  # fmt: skip
    assert predict(costs, sizes).update == pytest.approx(kept)
    if groups:  # a and b take each other's answers whole and at most `budget` of c's; c takes at most `budget`
        across = budget or 0
        assert kept == [prompts * (4 + 2 + across), prompts * (2 + 4 + across), prompts * (8 + across)]
