"""Sharing policies through the trainer: `all` is today's pool, a policy that keeps every row changes no number,
every policy resumes exactly, the step line and the run's summary say what was kept, bad settings are refused."""

from __future__ import annotations

import pytest

from tests.conftest import assert_resumes_exactly, fails_cleanly, pair_config, records, same_numbers

POLICIES = ["correct", "learner_fails", "top_k", "adaptive"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "sharing",
    [{"policy": "all"}, {"policy": "correct", "min_reward": 0.0}, {"policy": "top_k", "k": 4},
     {"budget_per_prompt": 4}],
    ids=["all", "correct-min0", "top_k-every-row", "budget-every-row"],
)  # fmt: skip
def test_a_policy_that_keeps_every_row_changes_no_number(sharing, reference, tiny_agents, tmp_path):
    """The reference run is the default (`all`, the paper); `correct` with min_reward 0 and `top_k` with k = the 4
    foreign rows a prompt has keep every row, and end with every training number of it (top_k's extra no-grad
    forward draws nothing from the random stream)."""
    from hacrl.tools.cli import main

    assert main(["train", str(pair_config(tiny_agents, tmp_path, sharing=sharing))]) == 0
    mine = records(tmp_path / "run")
    same_numbers(records(reference), mine)
    assert all(r["qwen/shared_kept"] == r["qwen/shared_offered"] == 8 for r in mine)
    assert all(r["llama/shared/qwen/offered"] == 8 and r["qwen/shared_tokens_saved"] == 0 for r in mine)


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_resumes_exactly(policy, tiny_agents, tmp_path):
    assert_resumes_exactly(
        lambda run: pair_config(
            tiny_agents, tmp_path, sharing={"policy": policy, "k": 1}, trainer={"steps": 2, "output_dir": str(run)}
        ),
        tmp_path,
        2,
    )


@pytest.mark.slow
def test_a_sharing_budget_bounds_every_learners_foreign_rows_and_resumes_exactly(tiny_agents, tmp_path):
    """`sharing.budget_per_prompt: 1` beside unequal rollout budgets (llama 8 answers per prompt, qwen 4): each
    learner trains on its own rows and at most one foreign row per prompt, whatever the other agent draws; the rule
    draws nothing at random, so a stopped and resumed run ends with the uninterrupted run's numbers."""
    import yaml

    def config(run):
        path = pair_config(tiny_agents, tmp_path, sharing={"budget_per_prompt": 1},
                           trainer={"steps": 2, "output_dir": str(run)})  # fmt: skip
        cfg = yaml.safe_load(path.read_text())
        cfg["agents"][0]["group_size"] = 8
        path.write_text(yaml.safe_dump(cfg))
        return path

    full, _ = assert_resumes_exactly(config, tmp_path, 2)
    for r in records(full):
        assert r["qwen/shared_offered"] == 16 and 0 < r["qwen/shared_kept"] <= 2
        assert r["llama/shared_offered"] == 8 and r["llama/shared_kept"] <= 2


@pytest.mark.slow
def test_the_step_line_and_the_run_summary_say_what_was_kept(tiny_agents, tmp_path, capsys):
    from hacrl.tools.cli import main

    cfg = pair_config(tiny_agents, tmp_path, sharing={"policy": "top_k", "k": 1}, trainer={"steps": 2})
    assert main(["train", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "llama: reward" in out and "kept 2/8" in out  # 2 prompts x k = 1 of 4 foreign rows each
    last = records(tmp_path / "run")[-1]
    saved = sum(r["qwen/shared_tokens_saved"] for r in records(tmp_path / "run"))
    assert "sharing.policy=top_k:" in out and "qwen: kept 4 of 16 foreign rows (25 %)" in out
    assert f"{saved:,} tokens not trained" in out and last["qwen/time/update_saved_est"] > 0


@pytest.mark.slow
def test_groups_of_agents_share_inside_and_across_only_through_the_budget(tiny_agents, tmp_path):
    """Four agents in two groups, [[llama, llama2], [qwen, tiny]] (llama2: llama's model under another name): without
    a budget a learner trains on its partner's rows only; with `budget_per_prompt: 1` on at most one row per prompt
    from the other group; a stopped and resumed run ends with the uninterrupted run's numbers."""
    from tests.conftest import write_config

    agents = {**tiny_agents, "llama2": tiny_agents["llama"]}
    names = ["llama", "llama2", "qwen", "tiny"]

    def config(run, budget=None):
        sharing = {"groups": [["llama", "llama2"], ["qwen", "tiny"]], "budget_per_prompt": budget}
        return write_config(tmp_path / "c.yaml", agents, names, run, sharing=sharing, trainer={"steps": 2})

    from hacrl.tools.cli import main

    assert main(["train", str(config(tmp_path / "closed"))]) == 0
    for r in records(tmp_path / "closed"):
        assert r["llama/shared/llama2/kept"] == 8 and r["llama/shared/qwen/kept"] == 0 == r["llama/shared/tiny/kept"]
        assert r["tiny/shared/qwen/kept"] == 8 and r["tiny/shared/llama/kept"] == 0
    full, _ = assert_resumes_exactly(lambda run: config(run, 1), tmp_path, 2)
    for r in records(full):
        across = r["qwen/shared/llama/kept"] + r["qwen/shared/llama2/kept"]
        assert r["qwen/shared/tiny/kept"] == 8 and across <= 2  # 2 prompts, one row each from the other group


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algorithm.name=gspo", "sharing.policy=correct"], "sharing.policy=correct chooses which"),
        (["algorithm.share_rollouts=false", "sharing.policy=top_k"], "share_rollouts=False and 2 agent(s)"),
        (["sharing.policy=correct", "sharing.min_reward=2"], "sharing.min_reward=2.0 is above algorithm.r_max=1.0"),
        (
            ["sharing.policy=learner_fails", "sharing.fail_below=0"],
            "sharing.fail_below=0.0 must be in (0, algorithm.r_max=1.0]",
        ),
        (["sharing.policy=adaptive", "sharing.margin=1"], "sharing.margin=1.0 must be below algorithm.r_max=1.0"),
        (["sharing.k=0"], "sharing.k must be >= 1"),
        (["sharing.budget_per_prompt=-1"], "sharing.budget_per_prompt must be >= 0"),
        (["algorithm.name=gspo", "sharing.budget_per_prompt=2"], "sharing.budget_per_prompt=2 bounds the other"),
        (["sharing.policy=best"], "sharing.policy"),
        (["sharing.groups=[[llama, qwen, qwen]]"], "sharing.groups lists twice: ['qwen']"),
        (["sharing.groups=[[llama, mistral]]"], "sharing.groups names no agent: ['mistral']"),
        (["sharing.groups=[[llama], [qwen]]"], "sharing.groups has a group of one"),
        (["algorithm.name=gspo", "sharing.groups=[[llama, qwen]]"], "sharing.groups=[['llama', 'qwen']] groups"),
    ],
)
def test_bad_sharing_settings_are_refused_naming_the_key(overrides, message, tiny_agents, tmp_path, capsys):
    fails_cleanly(capsys, ["train", str(pair_config(tiny_agents, tmp_path)), *overrides], message)


def test_a_checkpoint_from_before_sharing_existed_resumes_as_all_and_refuses_another_policy():
    """A checkpoint's config.yaml without a `sharing` group was written by a version that shared everything: resuming
    it with `all` changes nothing, with another policy would change the numbers and is refused."""
    from dataclasses import asdict, replace

    from hacrl.config import SharingConfig, TrainConfig
    from hacrl.driver.resume import resume_differences

    now = TrainConfig()
    saved = asdict(now)
    del saved["sharing"]
    assert resume_differences(saved, now) == ([], [])
    refused, _ = resume_differences(saved, replace(now, sharing=SharingConfig(policy="top_k")))
    assert refused == ["sharing.policy: 'all' in the checkpoint, 'top_k' now"]


def test_a_sharing_setting_the_policy_does_not_read_is_neither_checked_nor_compared_on_resume():
    """Issue 61, 22: `algorithm.r_max: 0.4` was refused because of `sharing.fail_below`'s default (0.5) although
    `policy: all` never reads it, and a changed `sharing.min_reward` refused a resume under `all`."""
    from dataclasses import asdict, replace

    from hacrl.config import AlgorithmConfig, ConfigError, SharingConfig, TrainConfig, validate
    from hacrl.driver.resume import resume_differences

    config = TrainConfig()
    config.agents = [_agent("a"), _agent("b")]
    config.algorithm = AlgorithmConfig(r_max=0.4)
    validate(config)  # `all` reads none of fail_below, min_reward, margin
    config.sharing = SharingConfig(policy="learner_fails")
    with pytest.raises(ConfigError, match=r"sharing.fail_below=0.5 must be in \(0, algorithm.r_max=0.4\]"):
        validate(config)
    saved = asdict(TrainConfig())
    current = replace(TrainConfig(), sharing=SharingConfig(min_reward=0.5, fail_below=0.2, margin=0.1))
    assert resume_differences(saved, current) == ([], [])
    refused, _ = resume_differences(saved, replace(TrainConfig(), sharing=SharingConfig(policy="correct",
                                                                                        min_reward=0.5)))  # fmt: skip
    assert refused == ["sharing.min_reward: None in the checkpoint, 0.5 now",
                       "sharing.policy: 'all' in the checkpoint, 'correct' now"]  # fmt: skip
    saved["sharing"]["policy"] = "correct"
    refused, _ = resume_differences(saved, replace(TrainConfig(), sharing=SharingConfig(policy="correct",
                                                                                        min_reward=0.5)))  # fmt: skip
    assert refused == ["sharing.min_reward: None in the checkpoint, 0.5 now"]
    # every policy reads the budget and the groups: a change of either is refused under any policy (it was let
    # through as "unread" before)
    budgeted = replace(TrainConfig(), sharing=SharingConfig(policy="correct", budget_per_prompt=4))
    refused, _ = resume_differences(saved, budgeted)
    assert refused == ["sharing.budget_per_prompt: None in the checkpoint, 4 now"]


def _agent(name):
    from hacrl.config import AgentConfig

    return AgentConfig(name=name, model="/m")
