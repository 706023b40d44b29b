"""The config tree: each group checks its own fields, scoring settings live in `scoring:` (old keys refused with
their new names), and what a resume may change is read from each field's metadata."""

from __future__ import annotations

from pathlib import Path

import pytest

from hacrl.config import ConfigError, ScoringConfig, TrainConfig, load_config
from hacrl.driver.resume import resume_differences, resume_policy, resume_rules

DEMO = "configs/demo.yaml"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("scoring.workers=0", "scoring.workers must be >= 1, got 0"),
        ("scoring.function=no_colon", "scoring.function='no_colon' must look like 'package.module:function'"),
        ("scoring.on_timeout=2.0", r"scoring.on_timeout=2.0 must be in \[0, algorithm.r_max=1.0\]"),
        ("agents.1.top_p=0", r"agents.1.top_p must be in \(0, 1\], got 0"),
        ("rollout.kv_cache_margin=1.5", r"rollout.kv_cache_margin must be in \[0, 1\)"),
        ("trainer.micro_batch_size=3", "trainer.micro_batch_size=3 must divide trainer.mini_batch_size=64"),
        ("eval.max_prompts=0", "eval.max_prompts must be >= 1 or null"),
        ("checkpoint.keep_last=0", "checkpoint.every must be >= 0 and checkpoint.keep_last >= 1"),
        ("algorithm.capability_window=0", "algorithm.capability_window must be >= 1"),
        ("trainer.old_logprobs=cached", "Invalid value 'cached', expected one of \\['auto', 'recompute', 'sampler', "),
        ("scoring.isolation=thread", "Invalid value 'thread'"),
        ("agents.0.name=eval", "agents.0.name='eval' is the first part of run-wide metric keys"),
        ("agents.0.devices=[]", r"agents.0.devices=\[\] names no device: list one or more, or remove it"),
        ("agents.0.devices=[cpu,cuda:0]", "a worker group runs on CPUs .* or on GPUs .*, not on a mix"),
        ("agents.0.devices=[cuda:1,cuda:1]", "names a GPU twice: each rank needs a GPU of its own"),
        ("agents.0.devices=3", "agents\\[0\\].devices: Invalid value assigned: int is not a ListConfig"),
    ],
)
def test_each_group_checks_its_fields_and_names_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(DEMO, [override])


def test_a_worker_group_refuses_what_it_cannot_shard():
    """A frozen agent has nothing to shard; LoRA agents stay on one device (said, with what to do)."""
    with pytest.raises(ConfigError, match="a frozen agent trains nothing, so sharding it"):
        load_config(DEMO, ["agents.0.devices=[cpu,cpu]", "agents.0.frozen=true"])
    with pytest.raises(ConfigError, match="LoRA agents train on one device"):
        load_config(DEMO, ["agents.0.devices=[cpu,cpu]", "agents.0.lora={r: 4}"])
    assert load_config(DEMO, ["agents.0.devices=[cpu,cpu]"]).agents[0].num_ranks == 2


def test_the_old_data_reward_keys_are_refused_with_their_new_names(tmp_path):
    with pytest.raises(ConfigError, match=r"data.reward_timeout -> scoring.timeout.*scoring.timeout=\.\.\."):
        load_config(DEMO, ["data.reward_timeout=3"])
    old = tmp_path / "old.yaml"
    old.write_text(
        "agents: [{name: a, model: m}]\nalgorithm: {name: gspo}\n"
        "data: {reward_function: 'my.mod:f', reward_workers: 2, task: chain_sum}\n"
    )
    with pytest.raises(ConfigError) as error:
        load_config(old)
    text = str(error.value)
    assert "data.reward_function -> scoring.function" in text and "data.reward_workers -> scoring.workers" in text
    new = load_config(DEMO, ["scoring.function=my.mod:f", "scoring.workers=2"])
    assert (new.scoring.function, new.scoring.workers) == ("my.mod:f", 2)


def test_the_resume_policy_is_each_fields_metadata():
    assert resume_policy("agents.3.device") == resume_policy("rollout.batch_size") == "not_exact"
    assert resume_policy("eval.num_samples") == resume_policy("runtime.ray.address") == "safe"
    assert resume_policy("scoring.timeout") == resume_policy("trainer.steps") == "safe"
    assert resume_policy("scoring.function") == resume_policy("algorithm.delta") == "refused"
    assert resume_policy("data.task_options.min_digits") == resume_policy("agents.0.lr") == "refused"
    assert resume_policy("no.such.key") == "refused"
    safe, not_exact = resume_rules("safe"), resume_rules("not_exact")
    assert {"eval.*", "logging.*", "checkpoint.*", "runtime.ray.*", "trainer.steps", "scoring.workers"} <= set(safe)
    assert {"agents.*.device", "agents.*.model", "trainer.micro_batch_size", "runtime.torch_threads"} <= set(not_exact)
    assert not set(safe) & set(not_exact)


def test_a_checkpoint_of_an_earlier_version_is_compared_under_the_new_names():
    """A checkpoint's config.yaml written with `data.reward_function` still refuses a resume that changes the reward
    function, and accepts one that only moves it to `scoring.function`."""
    current = load_config(DEMO, ["scoring.function=my.mod:g", "scoring.workers=3", "scoring.builtin=auto"])
    saved = _as_saved(current)
    saved["data"]["reward_function"] = "my.mod:f"
    saved["data"]["reward_workers"] = 1
    del saved["scoring"]
    refused, not_exact = resume_differences(saved, current)
    assert refused == ["scoring.function: 'my.mod:f' in the checkpoint, 'my.mod:g' now"] and not_exact == []
    saved["data"]["reward_function"] = "my.mod:g"
    assert resume_differences(saved, current) == ([], [])


def test_a_checkpoint_from_before_old_logprobs_auto_resumes_where_auto_means_the_same():
    """`trainer.old_logprobs: auto` (the default since vLLM's correction) is `recompute` for agents on hf / static: a
    checkpoint that says `recompute` resumes without a refusal; one that says `sampler` is refused, and so is
    `recompute` for an agent on vLLM, where `auto` means `corrected`."""
    current = load_config(DEMO)
    saved = _as_saved(current)
    saved["trainer"]["old_logprobs"] = "recompute"
    assert resume_differences(saved, current) == ([], [])
    saved["trainer"]["old_logprobs"] = "sampler"
    assert resume_differences(saved, current)[0] == ["trainer.old_logprobs: 'sampler' in the checkpoint, 'auto' now"]
    on_vllm = load_config(DEMO, ["agents.0.rollout_backend=vllm"])
    saved = _as_saved(on_vllm)
    saved["trainer"]["old_logprobs"] = "recompute"
    assert resume_differences(saved, on_vllm)[0] == ["trainer.old_logprobs: 'recompute' in the checkpoint, 'auto' now"]


def test_scoring_defaults_are_the_scorers():
    assert ScoringConfig().timeout == 5.0 and TrainConfig().scoring.isolation == "process"


def _as_saved(config) -> dict:
    from dataclasses import asdict

    return asdict(config)


def test_each_agents_settings_are_its_own_where_set_else_the_rollout_groups():
    """`AgentSettings.resolve` is the one fallback from agents.<i>.* to rollout.* (and the rows per call an unset
    rollout.batch_size means for each sampler)."""
    from hacrl.config import AgentConfig, RolloutConfig
    from hacrl.config.settings import AgentSettings

    rollout = RolloutConfig(temperature=0.7, top_p=0.9, max_new_tokens=64, max_prompt_tokens=32, kv_cache_margin=0.2)
    own = AgentConfig(name="a", model="m", temperature=1.3, max_new_tokens=16, rollout_backend="static")
    plain = AgentConfig(name="b", model="m")
    a, b = AgentSettings.resolve(own, rollout), AgentSettings.resolve(plain, rollout)
    assert (a.temperature, a.top_p, a.max_new_tokens, a.max_prompt_tokens) == (1.3, 0.9, 16, 32)
    assert (b.temperature, b.top_p, b.max_new_tokens, b.max_prompt_tokens) == (0.7, 0.9, 64, 32)
    assert (a.sampler, a.rows_per_call, b.sampler, b.rows_per_call) == ("static", "auto", "hf", "auto")
    assert a.max_tokens == 48 and a.kv_cache_margin == b.kv_cache_margin == 0.2
    given = RolloutConfig(batch_size=8)
    assert AgentSettings.resolve(own, given).rows_per_call == AgentSettings.resolve(plain, given).rows_per_call == 8


SHIPPED = sorted((Path(__file__).resolve().parents[2] / "configs").rglob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_config_loads_and_validates(path):
    """Every config under configs/ (the beds, the paper's pairs, the control and reach beds) passes its loader's
    checks as committed: a renamed key or a changed default that one of them contradicts fails here, not in a
    user's first run."""
    from hacrl.control.config import load_control_config

    text = path.read_text()
    config = (load_control_config if "policies:" in text else load_config)(str(path))
    assert config.trainer.steps >= 1
