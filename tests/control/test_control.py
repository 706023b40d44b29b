"""The control trainer (`hacrl control`): re-observation is exact, the core receives what the spec prescribes, a
run resumes exactly, bad configs are refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("mpe2")

from hacrl.control.config import load_control_config  # noqa: E402
from hacrl.control.env import Simple  # noqa: E402
from hacrl.control.observations import full, polar  # noqa: E402
from hacrl.tools.cli import main  # noqa: E402
from tests.conftest import fails_cleanly, records, without_timings  # noqa: E402

CONFIG = "configs/control.yaml"
SMALL = ["trainer.initial_states_per_step=2", "trainer.group_size=4", "trainer.mini_batch_size=4",
         "eval.initial_states=4", "logging.console=false", "logging.tensorboard=false"]  # fmt: skip


def _trainer(tmp_path, *overrides):
    from hacrl.control.trainer import ControlTrainer

    config = load_control_config(CONFIG, [*SMALL, f"trainer.output_dir={tmp_path / 'run'}", *overrides])
    return ControlTrainer(config)


def test_the_full_observation_is_the_environments_own_at_every_step(tmp_path):
    trainer = _trainer(tmp_path)
    try:
        episodes = trainer.sample(0, [11, 12], 2)
        for i, episode in enumerate(episodes):
            assert np.array_equal(full(episode.states), trainer.envs[0].observed(i))  # bit for bit, every step
    finally:
        trainer.close()


def test_a_learner_that_replays_a_foreign_episode_sees_exactly_its_re_observation(tmp_path):
    """Policy 0's episodes (full view, MLP) replayed action by action in fresh environments: the states are the
    logged ones, the polar learner's live observations are its re-observation of the logged states, and the GRU's
    step-by-step log-probs of those actions equal its teacher-forced ones over the re-observation."""
    trainer = _trainer(tmp_path)
    try:
        episodes = trainer.sample(0, [5, 6], 2)
        learner = trainer.policies[1]
        replay = Simple(trainer.config.env.max_cycles, trainer.config.env.success_distance)
        seeds = [5, 5, 6, 6]
        live_states = [np.stack(replay.reset(seeds))]
        live_obs, live_logp, hidden = [], [], learner.initial_state(len(seeds))
        with torch.no_grad():
            for t in range(trainer.config.env.max_cycles):
                obs = np.stack([polar(Simple.state(replay._env(i))[None])[0] for i in range(len(seeds))])
                live_obs.append(obs)
                logits, hidden = learner.step(torch.from_numpy(obs), hidden)
                actions = torch.tensor([int(e.actions[t]) for e in episodes])
                live_logp.append(torch.log_softmax(logits, -1).gather(-1, actions[:, None])[:, 0])
                live_states.append(np.stack(replay.step(actions.tolist())))
        assert np.array_equal(np.stack(live_states, axis=1), np.stack([e.states for e in episodes]))
        re_observed = trainer.observations(1, episodes).numpy()
        assert np.array_equal(np.stack(live_obs, axis=1), re_observed)
        with torch.no_grad():
            forced = trainer.logprobs(1, episodes)
        torch.testing.assert_close(torch.stack(live_logp, dim=1), forced, rtol=1e-5, atol=1e-6)
    finally:
        trainer.close()


def test_the_core_receives_what_the_spec_prescribes_for_the_same_numbers(tmp_path, monkeypatch):
    """One HACPO step: the advantage function gets the pool's rewards, prompts and sources in pool order (own
    episodes, then the other policy's), the tracker's capabilities; each mini-batch's loss gets the learner's per-step
    log-probs of the actions under its own view, every step in the mask, own rows' old log-probs, the source's summed
    log-prob and step count, m counting the mini-batches; the advantages equal `hacpo_advantages` on those numbers
    and the loss equals `hacpo_loss` on those inputs."""
    import hacrl.control.trainer as module
    from hacrl.core import hacpo_advantages, hacpo_loss

    trainer = _trainer(tmp_path, "trainer.mini_batch_size=8")
    seen: list = []
    real_adv, real_loss = trainer.algorithm.advantages, trainer.algorithm.loss

    class Recording:
        pool_is_shared = staticmethod(trainer.algorithm.pool_is_shared)
        loss_rho = staticmethod(trainer.algorithm.loss_rho)
        rho_metrics = staticmethod(trainer.algorithm.rho_metrics)

        @staticmethod
        def advantages(*args, **kwargs):
            out = real_adv(*args, **kwargs)
            seen.append(("adv", args, kwargs, out))
            return out

        @staticmethod
        def loss(inputs, **kwargs):
            out = real_loss(inputs, **kwargs)
            seen.append(("loss", inputs, kwargs, out))
            return out

    trainer.algorithm = Recording()
    episodes: dict[int, list] = {}
    real_sample = trainer.sample

    def sample(j, *args, **kwargs):
        episodes[j] = real_sample(j, *args, **kwargs)
        return episodes[j]

    monkeypatch.setattr(trainer, "sample", sample)
    try:
        trainer.train_step()
        caps = trainer.tracker.capabilities()
        for k in (0, 1):
            pool = episodes[k] + episodes[1 - k]
            calls = [c for c in seen if c[0] == "adv"][k], [c for c in seen if c[0] == "loss"][2 * k : 2 * k + 2]
            (_, args, kwargs, adv), losses = calls
            rewards, groups, sources = args
            assert rewards.tolist() == [e.reward for e in pool] and rewards.dtype == torch.float64
            assert groups.tolist() == [0, 0, 0, 0, 1, 1, 1, 1] * 2 and sources.tolist() == [k] * 8 + [1 - k] * 8
            assert kwargs["learner"] == k and torch.equal(kwargs["capabilities"], caps)
            expected_adv = hacpo_advantages(rewards, groups, sources, learner=k, capabilities=caps,
                                            capability_baseline=True)  # fmt: skip
            torch.testing.assert_close(adv, expected_adv, rtol=0, atol=0)
            for m, (_, inputs, loss_kwargs, out) in enumerate(losses):
                rows = pool[8 * m : 8 * m + 8]
                assert loss_kwargs["step_index"] == m
                assert inputs.mask.all() and inputs.mask.shape == (8, 25)
                assert inputs.source.tolist() == [e.source for e in rows]
                assert inputs.source_logp_sum.tolist() == [e.source_logp_sum for e in rows]
                assert inputs.source_num_tokens.tolist() == [25] * 8
                for i, e in enumerate(rows):
                    if e.source == k:
                        assert torch.equal(inputs.old_logp[i], e.old_logp)
                assert torch.equal(inputs.adv, adv[8 * m : 8 * m + 8].float())
                again = hacpo_loss(inputs, params=trainer.params, step_index=m)
                assert torch.equal(again.loss, out.loss)
        assert module.loss_inputs is not None
    finally:
        trainer.close()


def test_both_trainers_keep_the_same_rows_and_log_the_same_rho_for_every_algorithm_and_policy(tmp_path):
    """Issue 86.2: one keep rule (`hacrl.core.sharing.kept_rows`) and one rho (`Algorithm.loss_rho`) for both
    trainers. `hacrl control` weighed the budget by rho whenever `capability_coef` was on, `hacrl train` only under
    HACPO, so `naive` with a budget kept other rows in the two; both logged `rho/*` for naive, whose loss has no rho.
    On one pool of unequal capabilities: the same rows for every algorithm, policy and budget, and `rho/*` only
    where the loss has rho."""
    from dataclasses import replace
    from types import SimpleNamespace

    from hacrl.agent.learning import LearningRole
    from hacrl.agent.sharing import keep_mask
    from hacrl.control.config import CONTROL_SHARING_POLICIES
    from hacrl.control.trainer import ControlTrainer
    from hacrl.core import get_algorithm

    three = tmp_path / "three.yaml"  # with two agents rho scales every foreign row alike: a third tells them apart
    text = open(CONFIG).read().replace("policies:\n", "policies:\n  - {name: mlp-small, observation: full, "
                                        "architecture: mlp, hidden: 8, lr: 3.0e-3}\n", 1)  # fmt: skip
    three.write_text(text)
    gen = torch.Generator().manual_seed(0)
    groups = torch.arange(3).repeat_interleave(4).repeat(3)
    sources = torch.arange(3).repeat_interleave(12)
    rewards = torch.tensor([0.0, 0.3, 1.0], dtype=torch.float64)[torch.randint(0, 3, (36,), generator=gen)]
    differs = 0
    for name in ("naive", "hacpo"):
        run = tmp_path / name / "run"
        config = load_control_config(three, [*SMALL, f"trainer.output_dir={run}", f"algorithm.name={name}"])
        trainer = ControlTrainer(config)
        try:
            for _ in range(8):
                trainer.tracker.update([0.2, 0.9, 0.5])
            caps, algorithm = trainer.tracker.capabilities(), get_algorithm(name)
            for policy in CONTROL_SHARING_POLICIES:
                for budget in (None, 1, 2):
                    sharing = replace(trainer.config.sharing, policy=policy, budget_per_prompt=budget)
                    trainer.config = replace(trainer.config, sharing=sharing)
                    for k in (0, 1, 2):
                        pool_sources = (sources - k) % 3  # the learner's own rows first
                        adv = algorithm.advantages(rewards, groups, pool_sources, learner=k, capabilities=caps,
                                                   params=trainer.params)  # fmt: skip
                        control = trainer._kept(k, rewards, groups, pool_sources, adv).tolist()
                        learner = SimpleNamespace(algorithm=algorithm, index=k, params=trainer.params)
                        pool = [SimpleNamespace(reward=float(r), group=int(g), source=int(s))
                                for r, g, s in zip(rewards, groups, pool_sources, strict=True)]  # fmt: skip
                        llm = keep_mask(pool, adv.tolist(), caps, learner=k, sharing=sharing,
                                        r_max=trainer.params.r_max, relevance=lambda: None,
                                        rho=LearningRole._rho(learner, caps), names=trainer.names)  # fmt: skip
                        assert control == llm, (name, policy, budget, k)
                        by_rho = keep_mask(pool, adv.tolist(), caps, learner=k, sharing=sharing,
                                           r_max=trainer.params.r_max,
                                           relevance=lambda: None, rho=trainer.tracker.loss_coefficients(k),
                                           names=trainer.names)  # fmt: skip
                        differs += name == "naive" and by_rho != llm  # what control kept for naive before
            metrics = algorithm.rho_metrics(caps, 0, trainer.params, trainer.names)
            assert list(metrics) == ([] if name == "naive" else [f"rho/{n}" for n in trainer.names[1:]])
        finally:
            trainer.close()
    assert differs > 0  # the pool tells the two rules apart


@pytest.mark.slow
def test_a_control_run_resumes_exactly_and_writes_the_llm_trainers_formats(tmp_path):
    full_run, cut_run = tmp_path / "full", tmp_path / "cut"
    args = [*SMALL, "trainer.steps=3", "eval.every=2", "checkpoint.every=1"]
    assert main(["control", CONFIG, *args, f"trainer.output_dir={full_run}"]) == 0
    assert main(["control", CONFIG, *args, "trainer.steps=2", f"trainer.output_dir={cut_run}"]) == 0
    assert main(["control", CONFIG, *args, f"trainer.output_dir={cut_run}", "--resume"]) == 0
    assert without_timings(records(cut_run)[-1]) == without_timings(records(full_run)[-1])
    last = records(full_run)[-1]
    assert 0 <= last["eval/gru-polar/success"] <= 1 and "mlp-full/rho/gru-polar" in last
    from hacrl.driver.metrics import unknown_keys
    from hacrl.tools.plot import plot_run

    assert all(unknown_keys(r) == [] for r in records(full_run))  # every key is a registered metric
    assert plot_run(full_run)[0].read_bytes()[:4] == b"\x89PNG"
    checkpoint = full_run / "checkpoints" / "step_000003"
    from hacrl.checkpoint import checkpoint_problems

    assert checkpoint_problems(checkpoint) == []
    assert json.loads((checkpoint / "agents" / "gru-polar" / "config.json").read_text())["architecture"] == "gru"
    from safetensors.torch import load_file

    for name in ("mlp-full", "gru-polar"):
        a = load_file(full_run / "checkpoints" / "step_000003" / "agents" / name / "model.safetensors")
        b = load_file(cut_run / "checkpoints" / "step_000003" / "agents" / name / "model.safetensors")
        assert all(torch.equal(a[key], b[key]) for key in a)


@pytest.mark.slow
def test_skip_leaves_the_all_clipped_foreign_mini_batches_unstepped_and_resumes_exactly(tmp_path):
    """`trainer.zero_grad_step: skip` in `hacrl control`: with a window of one point (delta 0) every foreign episode
    is clipped, so each policy's two foreign mini-batches have a zero gradient and are not stepped; exact across a
    resume, and `take` steps them."""
    full_run, cut_run, taken = tmp_path / "full", tmp_path / "cut", tmp_path / "take"
    args = [*SMALL, "trainer.steps=2", "eval.every=0", "checkpoint.every=1", "algorithm.delta=0",
            "algorithm.delta_step=0"]  # fmt: skip
    assert main(["control", CONFIG, *args, "trainer.zero_grad_step=skip", f"trainer.output_dir={full_run}"]) == 0
    assert main(["control", CONFIG, *args, "trainer.zero_grad_step=skip", "trainer.steps=1",
                 f"trainer.output_dir={cut_run}"]) == 0  # fmt: skip
    assert main(["control", CONFIG, *args, "trainer.zero_grad_step=skip", f"trainer.output_dir={cut_run}",
                 "--resume"]) == 0  # fmt: skip
    assert without_timings(records(cut_run)[-1]) == without_timings(records(full_run)[-1])
    steps = [r for r in records(full_run) if "mlp-full/loss" in r]  # not the evaluation at the start
    assert len(steps) == 2
    for record in steps:
        assert record["mlp-full/foreign_clip_frac"] == 1.0
        assert record["mlp-full/zero_grad_skipped"] == 2 and record["mlp-full/optimizer_steps"] == 2
    assert main(["control", CONFIG, *args, f"trainer.output_dir={taken}"]) == 0
    assert records(taken)[-1]["mlp-full/optimizer_steps"] == 4


def test_sigterm_finishes_the_step_checkpoints_and_the_resumed_run_ends_where_an_uninterrupted_one_does(
    tmp_path, capsys, monkeypatch
):
    """The LLM trainer's graceful stop (`hacrl.driver.runloop`, one loop for both trainers): SIGTERM during step 2
    of 3 with no scheduled checkpoint before the end: step 2 finishes, a checkpoint of it is written, the exit status
    is 128 + 15 and the message says how to continue with `hacrl control`; the resumed run's last record and
    weights equal an uninterrupted run's."""
    import os
    import signal

    from hacrl.control.trainer import ControlTrainer

    full_run, cut_run = tmp_path / "full", tmp_path / "cut"
    args = [*SMALL, "trainer.steps=3", "eval.every=0", "checkpoint.every=0"]
    assert main(["control", CONFIG, *args, f"trainer.output_dir={full_run}"]) == 0
    real_step = ControlTrainer.train_step

    def step_then_sigterm(self):
        metrics = real_step(self)
        if self.step == 1:  # the second step's work is done (self.step counts finished steps)
            os.kill(os.getpid(), signal.SIGTERM)
        return metrics

    monkeypatch.setattr(ControlTrainer, "train_step", step_then_sigterm)
    capsys.readouterr()
    assert main(["control", CONFIG, *args, f"trainer.output_dir={cut_run}"]) == 128 + signal.SIGTERM
    out, err = capsys.readouterr()
    assert "stopped by SIGTERM after step 2 of 3; wrote checkpoint" in err
    assert "`hacrl control <config> --resume`" in err and "SIGTERM received: finishing step 2, then" in out
    assert sorted(p.name for p in (cut_run / "checkpoints").iterdir()) == ["step_000002"]
    monkeypatch.setattr(ControlTrainer, "train_step", real_step)
    assert main(["control", CONFIG, *args, f"trainer.output_dir={cut_run}", "--resume"]) == 0
    assert without_timings(records(cut_run)[-1]) == without_timings(records(full_run)[-1])
    from safetensors.torch import load_file

    for name in ("mlp-full", "gru-polar"):
        a = load_file(full_run / "checkpoints" / "step_000003" / "agents" / name / "model.safetensors")
        b = load_file(cut_run / "checkpoints" / "step_000003" / "agents" / name / "model.safetensors")
        assert all(torch.equal(a[key], b[key]) for key in a)


def test_a_stop_between_a_steps_metrics_and_its_checkpoint_names_that_step(tmp_path, capsys, monkeypatch):
    """Issue 87.11: SIGTERM after step 1's metrics line, before its checkpoint, said "finishing step 2", then "stopped
    after step 1". The notice names the step whose checkpoint is being written, as the stop does."""
    import os
    import signal

    from hacrl.control.trainer import ControlTrainer

    real_save = ControlTrainer.save

    def sigterm_then_save(self):
        if self.step == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_save(self)

    monkeypatch.setattr(ControlTrainer, "save", sigterm_then_save)
    run = tmp_path / "run"
    capsys.readouterr()
    args = [*SMALL, "trainer.steps=3", "eval.every=0", "checkpoint.every=1", f"trainer.output_dir={run}"]
    assert main(["control", CONFIG, *args]) == 128 + signal.SIGTERM
    out, err = capsys.readouterr()
    assert "SIGTERM received: finishing step 1, then writing a checkpoint" in out and "step 2" not in out + err, out
    assert "stopped by SIGTERM after step 1 of 3; its latest checkpoint is" in err


def test_a_full_disk_under_the_safetensors_writer_is_named_and_the_last_checkpoint_resumes(
    tmp_path, capsys, monkeypatch
):
    """Found by the control chaos soak: safetensors raises its own SafetensorError ("... (os error 28)") on a full
    disk, which ended `hacrl control` in a traceback, exit 1. Now the one OSError path names it (exit 2), the previous
    checkpoint stays the newest, complete, and the run resumes from it."""
    import safetensors.torch
    from safetensors import SafetensorError

    from hacrl.checkpoint import checkpoint_problems

    real, calls = safetensors.torch.save_file, {"n": 0}

    def disk_full(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > 2:  # both policies' step-1 weights written, then the disk is full
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
        return real(*args, **kwargs)

    monkeypatch.setattr(safetensors.torch, "save_file", disk_full)
    run = tmp_path / "run"
    args = [*SMALL, "trainer.steps=2", "eval.at_start=false", "checkpoint.every=1", f"trainer.output_dir={run}"]
    assert main(["control", CONFIG, *args]) == 2
    err = capsys.readouterr().err
    assert "hacrl: No space left on device" in err and "free disk space (or point trainer.output_dir" in err, err
    assert "Traceback" not in err
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step_000001"]
    assert checkpoint_problems(run / "checkpoints" / "step_000001") == []
    monkeypatch.setattr(safetensors.torch, "save_file", real)
    assert main(["control", CONFIG, *args, "--resume"]) == 0
    assert [r["step"] for r in records(run)] == [1, 2]


def test_a_sigterm_before_the_first_step_or_after_the_last_is_said_not_a_silent_death(tmp_path, capsys, monkeypatch):
    """Found by the control soak (issue 87.16): SIGTERM while the run closed after its last step killed it silently
    (exit -15), and so did one while `hacrl control` loaded or prepared its run directory. After the last step the
    run is complete: it closes and exits 0; before the first, it stops in one line, exit 143, nothing trained."""
    import os
    import signal

    import hacrl.driver.runloop as runloop
    from hacrl.control.trainer import ControlTrainer

    real_close = ControlTrainer.close

    def sigterm_then_close(self, **kwargs):
        if self.step == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_close(self, **kwargs)

    monkeypatch.setattr(ControlTrainer, "close", sigterm_then_close)
    run = tmp_path / "run"
    args = [*SMALL, "trainer.steps=2", "eval.every=0", f"trainer.output_dir={run}"]
    capsys.readouterr()
    assert main(["control", CONFIG, *args]) == 0
    assert "SIGTERM received: between steps: stopping" in "".join(capsys.readouterr())
    assert (run / "checkpoints" / "step_000002").is_dir()
    monkeypatch.setattr(ControlTrainer, "close", real_close)
    real_prepare = runloop.prepare_run_dir

    def sigterm_then_prepare(*a, **k):
        os.kill(os.getpid(), signal.SIGTERM)
        return real_prepare(*a, **k)

    monkeypatch.setattr(runloop, "prepare_run_dir", sigterm_then_prepare)
    other = tmp_path / "other"
    assert main(["control", CONFIG, *SMALL, "trainer.steps=2", f"trainer.output_dir={other}"]) == 128 + signal.SIGTERM
    assert "stopped by SIGTERM after step 0 of 2; no step had finished" in capsys.readouterr().err
    assert not (other / "checkpoints").exists() or not any((other / "checkpoints").iterdir())


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["trainer.mini_batch_size=3"], "trainer.mini_batch_size=3 must divide"),
        (["policies.1.name=mlp-full"], "policy names must be unique"),
        (["algorithm.name=nope"], "is not a registered algorithm"),
        (["policies.0.architecture=transformer"], "policies[0].architecture: Invalid value 'transformer'"),
        (["trainer.steps=2", "trainer.seed=1", "env.max_cycles=0"], "env.max_cycles must be in [1, 1000]"),
        # issue 61, 3, 7 and 13: the LLM config's name, finite-number and size checks apply to control too
        (
            ["policies.1.name=../../../../victim"],
            "policies.1.name='../../../../victim' (18 characters) is not a folder-safe name",
        ),
        (["policies.0.name=eval"], "policies.0.name='eval' is the first part of run-wide metric keys"),
        (["env.max_cycles=100000000"], "env.max_cycles must be in [1, 1000]"),
        (["policies.0.lr=.inf"], "policies.0.lr=inf must be a finite number"),
        (["policies.0.hidden=100000000"], "1 <= hidden <= 4096"),
        (["trainer.temperature=.inf"], "trainer.temperature=inf must be a finite number"),
        (["env.success_distance=.inf"], "env.success_distance=inf must be a finite number"),
        (["trainer.group_size=100000"], "past hacrl's limits"),
    ],
)
def test_bad_control_settings_are_refused_naming_the_key(overrides, message, tmp_path, capsys):
    """Refused before anything is written: the run directory stays empty."""
    run = tmp_path / "run"
    fails_cleanly(capsys, ["control", CONFIG, *SMALL, f"trainer.output_dir={run}", *overrides], message)
    assert not run.exists()


def test_resume_refuses_a_changed_setting(tmp_path, capsys):
    """Issue 60: control's resume is `hacrl.driver.resume`'s, as for `hacrl train`: a change of the numbers is
    refused naming both values and the keys that may change; a not-exact change is announced; under
    `checkpoint.strict_resume=false` a refused change resumes with a warning (control used to resume silently)."""
    from hacrl.errors import HacrlWarning

    run = tmp_path / "run"
    assert main(["control", CONFIG, *SMALL, "trainer.steps=1", "eval.at_start=false", f"trainer.output_dir={run}"]) == 0
    fails_cleanly(capsys, ["control", CONFIG, *SMALL, "trainer.steps=2", f"trainer.output_dir={run}",
                           "policies.0.lr=0.1", "--resume"], "policies.0.lr: 0.003 in the checkpoint, 0.1 now",
                  "Safe to change on resume: trainer.steps, trainer.output_dir, eval.*, logging.*, checkpoint.*",
                  "allowed but no longer bit-exact: trainer.torch_threads")  # fmt: skip
    assert main(["control", CONFIG, *SMALL, "trainer.steps=2", f"trainer.output_dir={run}", "trainer.torch_threads=2",
                 "eval.initial_states=5", "--resume"]) == 0  # fmt: skip
    assert "resuming with trainer.torch_threads: 1 in the checkpoint, 2 now: allowed, but no longer bit-identical" in (
        capsys.readouterr().err
    )
    with pytest.warns(HacrlWarning, match="resuming with a changed setting .*policies.0.lr: 0.003 in the checkpoint"):
        assert main(["control", CONFIG, *SMALL, "trainer.steps=3", f"trainer.output_dir={run}", "policies.0.lr=0.1",
                     "checkpoint.strict_resume=false", "--resume"]) == 0  # fmt: skip
    # the changed lr is the one it trains at (torch's load_state_dict restored the checkpoint's: found in issue 87)
    from hacrl.control.trainer import ControlTrainer

    config = load_control_config(CONFIG, [*SMALL, f"trainer.output_dir={run}", "policies.0.lr=0.5",
                                          "checkpoint.strict_resume=false"])  # fmt: skip
    with pytest.warns(HacrlWarning):
        trainer = ControlTrainer(config, resume="auto")
    assert [g["lr"] for g in trainer.optimizers[0].param_groups] == [0.5] and trainer.step == 3


def test_without_the_extra_the_message_names_it_before_the_run_directory_exists(monkeypatch, tmp_path, capsys):
    """Issue 61, 12: without the extra, `hacrl control` failed at its first evaluation, after creating the run
    directory; now the config's check refuses it first."""
    import importlib.util
    import sys

    from hacrl.control.env import _require_mpe2
    from hacrl.errors import ConfigError

    monkeypatch.setitem(sys.modules, "mpe2", None)
    with pytest.raises(ConfigError, match=r'pip install "hacrl\[control\]"'):
        _require_mpe2()
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mpe2" else real(name, *a))
    run = tmp_path / "run"
    fails_cleanly(capsys, ["control", CONFIG, *SMALL, f"trainer.output_dir={run}"], 'pip install "hacrl[control]"')
    assert not run.exists()


def test_every_seed_of_a_control_run_is_a_named_stream_none_twice(tmp_path, monkeypatch):
    """Issue 60: control seeded its policies with `seed*1000+i` (a policy's init seed could equal another's sampling
    seed, and seeds.py's "here and nowhere else" was false). Every torch seed of a control run, global or a
    generator's, and its initial-state stream are `hacrl.seeds` streams, none twice."""
    from hacrl import seeds

    seeded: list[int] = []
    real = torch.manual_seed

    class Generator(torch.Generator):
        def manual_seed(self, s):
            seeded.append(int(s))
            return super().manual_seed(s)

    monkeypatch.setattr(torch, "manual_seed", lambda s: (seeded.append(int(s)), real(s))[1])
    monkeypatch.setattr(torch, "Generator", Generator)
    pcg = []
    real_pcg = np.random.PCG64
    monkeypatch.setattr(np.random, "PCG64", lambda s: (pcg.append(int(s)), real_pcg(s))[1])
    trainer = _trainer(tmp_path, "trainer.seed=3")
    trainer.close()
    assert seeded == [seeds.adapters(3, 0), seeds.training(3, 0), seeds.adapters(3, 1), seeds.training(3, 1)]
    assert pcg == [seeds.prompts(3, 0)]
    assert set(seeded) | set(pcg) <= set(seeds.streams(3, agents=2, steps=0, epochs=1).values())
    assert len(set(seeded) | set(pcg)) == 5


# -- a diverging policy and a hostile checkpoint (issue 87.3-5) ----------------------------------------------------


@pytest.mark.slow
def test_a_diverging_policy_stops_naming_it_before_the_simulator_and_no_checkpoint_holds_it(tmp_path, capsys):
    """Issue 87.3: at `policies.0.lr=100` (here 1e30, which diverges within the small run's steps; or
    `trainer.temperature=1e300`) the control trainer died after a step or two with `ValueError: logp contains ...
    non-finite` from the core. Now: one paragraph naming the policy, the cause and the keys; the newest checkpoint
    stays the last finite state."""
    from safetensors.torch import load_file

    run = tmp_path / "run"
    args = [*SMALL, f"trainer.output_dir={run}", "checkpoint.every=1", "eval.every=0"]
    err = fails_cleanly(capsys, ["control", "configs/reach.yaml", *args, "trainer.steps=4", "policies.0.lr=1e30"],
                        "policy 'arm2'", "lower policies.0.lr (now 1e+30) or policies.0.grad_clip",
                        f"its newest checkpoint ({run / 'checkpoints'}")  # fmt: skip
    assert "at step 2:" in err or "at step 3:" in err or "at step 4:" in err
    for step in sorted((run / "checkpoints").iterdir()):
        weights = load_file(step / "agents" / "arm2" / "model.safetensors")
        assert all(bool(v.isfinite().all()) for v in weights.values())
    hot = tmp_path / "hot"
    fails_cleanly(capsys, ["control", "configs/reach.yaml", *SMALL, f"trainer.output_dir={hot}", "trainer.steps=2",
                           "trainer.temperature=1e300"], "policy 'arm2' drew NaN or inf actions at step 1",
                  "its outputs at trainer.temperature=1e+300 are not", "this run has no checkpoint yet")  # fmt: skip


def test_a_non_finite_log_prob_skips_the_step_and_counts_it(tmp_path):
    """As in the LLM trainer: a non-finite log-prob in the loss gives a non-finite gradient norm, and the optimizer
    step is skipped and counted (`skipped_steps`), the weights untouched."""
    trainer = _trainer(tmp_path, "trainer.steps=1")
    before = {k: v.clone() for k, v in trainer.policies[0].state_dict().items()}
    episodes = trainer.sample(0, [1, 2], 4)
    caps = torch.ones(2) / 2
    import hacrl.control.trainer as control

    real = control.token_logprobs
    control.token_logprobs = lambda *a, **k: real(*a, **k) * float("nan")
    try:
        metrics = trainer.learn(0, episodes, caps)
    finally:
        control.token_logprobs = real
    assert metrics["skipped_steps"] == 2 and metrics["optimizer_steps"] == 0
    assert all(torch.equal(before[k], v) for k, v in trainer.policies[0].state_dict().items())


@pytest.mark.slow
def test_a_checkpoint_with_nan_weights_or_hostile_buffers_is_refused_on_resume(tmp_path, capsys):
    """Issue 87.4-5: a control checkpoint whose policy weights are NaN (digests made to match) was resumed, and
    MuJoCo's "Nan, Inf or huge value" and a ValueError followed; its buffers.pt values were not checked (a NaN reward
    or `source` 7: tracebacks; NaN states or group 10^6: taken silently). Each is refused in one paragraph naming the
    file and what to do; the untouched checkpoint still resumes."""
    from safetensors.torch import load_file, save_file

    from tests.driver.test_untrusted_files import redigest

    run = tmp_path / "run"
    args = [*SMALL, f"trainer.output_dir={run}", "checkpoint.every=1", "eval.every=0", "algorithm.name=hacpo",
            "sharing.replay.steps=2", "sharing.replay.groups=1"]  # fmt: skip
    assert main(["control", CONFIG, *args, "trainer.steps=2"]) == 0
    checkpoint = run / "checkpoints" / "step_000002"
    good = {p: p.read_bytes() for p in checkpoint.rglob("*") if p.is_file()}

    def restore() -> None:
        for path, data in good.items():
            path.write_bytes(data)

    weights = checkpoint / "agents" / "mlp-full" / "model.safetensors"
    values = load_file(weights)
    values[next(iter(values))][0] = float("nan")
    save_file(values, str(weights))
    redigest(checkpoint)
    resume = ["control", CONFIG, *args, "trainer.steps=3", "--resume"]
    fails_cleanly(capsys, resume, "policy 'mlp-full''s weights hold NaN or inf", "resume from an earlier checkpoint")
    restore()
    buffers = checkpoint / "buffers.pt"
    for field, index, value, expected in (("reward", 0, float("nan"), "its reward hold NaN or inf"),
                                          ("source", 0, 7, "must be the policy's own (source 0)"),
                                          ("states", 0, float("nan"), "its states hold NaN or inf"),
                                          ("group", 0, 10**6, "its groups must index its")):  # fmt: skip
        state = torch.load(buffers, weights_only=True)
        state["held"][0][0][field][index] = value
        torch.save(state, buffers)
        redigest(checkpoint)
        fails_cleanly(capsys, resume, "cannot load its experience buffers (buffers.pt: ValueError: policy 0's "
                      "buffer, step", expected)  # fmt: skip
        restore()
    assert main(resume) == 0
