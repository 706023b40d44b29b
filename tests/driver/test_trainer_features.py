"""Trainer features beyond the plain run: skipped non-finite steps, KL, user rewards, crash safety, eval, plot."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from hacrl.checkpoint import latest_checkpoint
from hacrl.config import load_config
from hacrl.core.sharing import foreign_of
from hacrl.driver.metrics import unknown_keys
from hacrl.driver.trainer import Trainer
from hacrl.messages import Trajectory
from hacrl.tools.cli import main
from tests.conftest import pair_config, records, without_timings, write_config


def test_foreign_trajectories_are_the_others_in_config_order():
    """The driver's pool filter: learner k's foreign rows are every other agent's, sources in config order, each in
    the order it sampled; none when the algorithm does not share."""
    pool = [Trajectory(0, text, 1.0, source, -1.0, 1, "eos", 1) for text, source in
            [("a", 2), ("b", 0), ("c", 1), ("d", 0), ("e", 2)]]  # fmt: skip
    assert [t.text for t in foreign_of(pool, 1, shared=True)] == ["b", "d", "a", "e"]
    assert foreign_of(pool, 0, shared=False) == []


@pytest.mark.slow
def test_a_non_finite_gradient_skips_the_step_and_is_logged(tiny_agents, tmp_path):
    cfg = write_config(
        tmp_path / "c.yaml",
        tiny_agents,
        ["llama", "qwen"],
        tmp_path / "run",
        trainer={"steps": 1},
        checkpoint={"every": 0},
    )
    trainer = Trainer(load_config(cfg))
    llama = trainer.schedule.transport.learners[0].agent  # the local backend keeps its workers in this process
    before = {k: v.clone() for k, v in llama.model.state_dict().items()}
    llama.model.get_input_embeddings().weight.register_hook(lambda g: g * float("inf"))
    metrics = trainer.train_step()
    assert metrics["llama/skipped_steps"] == 4 and metrics["llama/optimizer_steps"] == 0  # steps taken: none
    assert metrics["qwen/optimizer_steps"] == 4
    assert all(torch.equal(before[k], v) for k, v in llama.model.state_dict().items())
    assert metrics["qwen/skipped_steps"] == 0
    qwen = trainer.schedule.transport.learners[1].agent  # it took its steps: gradients freed, not held through sampling
    assert all(p.grad is None for p in qwen.model.parameters())
    assert qwen.optimizer.state  # (the AdamW moments stay)


@pytest.mark.slow
def test_kl_to_the_frozen_initial_weights(tiny_agents, tmp_path):
    run = tmp_path / "run"
    cfg = write_config(
        tmp_path / "c.yaml",
        tiny_agents,
        ["llama", "qwen"],
        run,
        algorithm={"kl_coef": 0.1},
        trainer={"steps": 2},
        checkpoint={"every": 0},
        scoring={"function": "tests.reward_fixtures:digits"},  # graded: the agents move from step 1 on
    )
    assert main(["train", str(cfg)]) == 0
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [key for r in records for key in unknown_keys(r)] == []
    for r in records:
        for name in ("llama", "qwen"):
            assert r[f"{name}/kl"] > 0  # the agents moved away from their initial weights ...
            # ... and the KL term is in the loss with its coefficient
            assert abs(r[f"{name}/loss"] - (r[f"{name}/policy_loss"] + 0.1 * r[f"{name}/kl"])) < 1e-6
    assert records[1]["llama/kl"] > records[0]["llama/kl"]


def three_eighths(prompts, completions, **columns):
    """A reward no built-in scorer gives every completion: seeing it in the metrics shows this function scored."""
    return [0.375] * len(completions)


@pytest.mark.slow
def test_user_reward_function_from_the_config(tiny_agents, tmp_path):
    run = tmp_path / "run"
    cfg = write_config(
        tmp_path / "c.yaml",
        tiny_agents,
        ["llama", "qwen"],
        run,
        trainer={"steps": 1},
        scoring={"function": "tests.driver.test_trainer_features:three_eighths"},
    )
    assert main(["train", str(cfg)]) == 0
    assert records(run)[-1]["llama/reward_mean"] == records(run)[-1]["qwen/reward_mean"] == 0.375


@pytest.mark.slow
def test_a_half_written_checkpoint_never_replaces_a_good_one(tiny_agents, tmp_path):
    run = tmp_path / "run"
    cfg = write_config(
        tmp_path / "c.yaml",
        tiny_agents,
        ["llama", "qwen"],
        run,
        trainer={"steps": 2},
        checkpoint={"every": 1, "keep_last": 5},
    )
    assert main(["train", str(cfg)]) == 0
    # simulate a crash while step 3 was being written: a partial temporary directory
    partial = run / "checkpoints" / "step_000003.tmp"
    shutil.copytree(run / "checkpoints" / "step_000002", partial)
    (partial / "state.json").unlink()
    (partial / "agents" / "qwen" / "model.safetensors").write_bytes(b"garbage")
    assert latest_checkpoint(run) == run / "checkpoints" / "step_000002"
    assert main(["train", str(cfg), "trainer.steps=3", "checkpoint.resume=auto"]) == 0
    assert latest_checkpoint(run) == run / "checkpoints" / "step_000003"
    assert not partial.exists()
    load_file(run / "checkpoints" / "step_000003" / "agents" / "qwen" / "model.safetensors")


@pytest.mark.slow
def test_keep_last_prunes_old_checkpoints(tiny_agents, tmp_path):
    run = tmp_path / "run"
    cfg = write_config(
        tmp_path / "c.yaml",
        tiny_agents,
        ["llama", "qwen"],
        run,
        trainer={"steps": 3},
        checkpoint={"every": 1, "keep_last": 2},
    )
    assert main(["train", str(cfg)]) == 0
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000002", "step_000003"]


@pytest.mark.slow
def test_eval_and_plot_commands(tiny_agents, tmp_path, capsys):
    run = tmp_path / "run"
    cfg = write_config(
        tmp_path / "c.yaml",
        tiny_agents,
        ["llama", "qwen"],
        run,
        trainer={"steps": 2},
        eval={"at_start": True, "every": 1, "num_samples": 2},
    )
    assert main(["train", str(cfg)]) == 0
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]
    assert all("eval/qwen/pass@1" in r and "eval/qwen/avg@2" in r for r in records)
    assert [key for r in records for key in unknown_keys(r)] == []  # every logged key is a registered metric
    capsys.readouterr()
    assert main(["eval", str(run / "checkpoints" / "step_000002"), str(tiny_agents["tiny"]), "--config", str(cfg)]) == 0
    table = capsys.readouterr().out
    assert "pass@1" in table and "llama" in table and "qwen" in table and "tiny" in table
    assert main(["plot", str(run)]) == 0
    png = run / "curves.png"
    assert png.read_bytes()[:4] == b"\x89PNG"
    capsys.readouterr()
    outside = tmp_path / "plots"
    outside.mkdir()
    assert main(["plot", str(run), "--out", str(outside)]) == 0  # a directory: curves.png in it (issue 42)
    assert capsys.readouterr().out.split() == [str(outside / "curves.png")]
    assert (outside / "curves.png").read_bytes()[:4] == b"\x89PNG" and not (tmp_path / "plots.png").exists()
    assert main(["plot", str(run), "--out", str(tmp_path / "curves")]) == 2
    assert "give a .png file or an existing directory" in capsys.readouterr().err


@pytest.mark.slow
def test_a_fresh_run_refuses_to_write_into_an_old_one(tiny_agents, tmp_path, capsys):
    run = tmp_path / "run"
    cfg = write_config(tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], run, trainer={"steps": 1})
    assert main(["train", str(cfg)]) == 0
    before = (run / "metrics.jsonl").read_text()
    assert main(["train", str(cfg)]) == 2
    assert "already holds a run (metrics up to step 1, with checkpoints); continue it with --resume" in (
        capsys.readouterr().err
    )
    assert (run / "metrics.jsonl").read_text() == before


@pytest.mark.slow
def test_pure_bfloat16_agents_train_and_save_in_their_dtype(tiny_agents, tmp_path):
    """`master_weights: none` (with float32 masters, the default, the checkpoint holds them: test_precision.py)."""
    run = tmp_path / "run"
    cfg = write_config(tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], run, trainer={"steps": 1})
    assert main(["train", str(cfg), "agents.1.dtype=bfloat16", "agents.1.master_weights=none"]) == 0
    weights = load_file(run / "checkpoints" / "step_000001" / "agents" / "qwen" / "model.safetensors")
    assert {w.dtype for w in weights.values()} == {torch.bfloat16}
    assert records(run)[-1]["qwen/skipped_steps"] == 0


def test_skipped_steps_are_announced_on_the_console(capsys):
    from hacrl.config import LoggingConfig
    from hacrl.driver.logger import MetricsLogger

    logger = MetricsLogger(LoggingConfig(console=False, jsonl=False, tensorboard=False), None, 1, ["a", "b"])
    logger.step_done(1, {"a/reward_mean": 0.5, "a/skipped_steps": 2, "b/reward_mean": 0.1, "b/skipped_steps": 0})
    assert "SKIPPED non-finite grad: a x2" in capsys.readouterr().out


def test_a_learner_whose_foreign_rows_are_all_clipped_for_five_steps_is_told_once_per_streak(capsys):
    """The real bed's round: every foreign row clipped, so sharing gave no gradient and only the optimizer's
    momentum step was left of it. The console says so after 5 such steps in a row, once, and again after a break."""
    from hacrl.config import LoggingConfig
    from hacrl.driver.logger import MetricsLogger

    logger = MetricsLogger(LoggingConfig(console=False, jsonl=False, tensorboard=False), None, 20, ["a", "b"])
    a_clipped = [1.0, 1.0, 1.0, 1.0, 0.99, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0]
    told = []
    for step, clipped in enumerate(a_clipped, start=1):
        logger.step_done(step, {"a/reward_mean": 0.5, "a/foreign_clip_frac": clipped, "b/reward_mean": 0.1,
                                "b/foreign_clip_frac": 0.2})  # fmt: skip
        out = capsys.readouterr().out
        told += [(step, line) for line in out.splitlines() if line.startswith("note: every foreign row")]
    assert [step for step, _ in told] == [10, 20]  # streaks: steps 1-4 (too short), 6-14, 16-20: their 5th steps
    assert "'a'" in told[0][1] and "no gradient" in told[0][1] and "docs/design.md" in told[0][1]
    logger.close()


def test_every_agents_rewards_come_back_with_its_own_timeouts_and_errors():
    """All agents' completions are scored in one call; the result is split back per agent, timeout and error
    indexes made relative to each agent's rows."""
    from types import SimpleNamespace

    from hacrl.driver.scoring import ScoreResult
    from hacrl.tasks.data import Example

    calls = []

    def score(prompts, texts, columns):
        calls.append((list(prompts), list(texts), columns))
        return ScoreResult([float(i) for i in range(len(texts))], timeouts=[1, 4], errors=[3])

    fake = SimpleNamespace(scorer=SimpleNamespace(score=score))
    batch = [Example(messages=[], prompt=f"p{i}", columns={"answer": str(i)}) for i in range(2)]
    # agent a draws 2 answers per prompt, agent b 1 (`agents.<i>.group_size`): each row is scored on its own prompt
    per_agent = [[SimpleNamespace(text=f"a{i}", group=i // 2) for i in range(4)],
                 [SimpleNamespace(text=f"b{i}", group=i) for i in range(2)]]  # fmt: skip
    first, second = Trainer._score_all(fake, batch, per_agent)
    assert len(calls) == 1 and calls[0][1] == ["a0", "a1", "a2", "a3", "b0", "b1"]
    prompts, _, columns = calls[0]
    assert prompts == ["p0", "p0", "p1", "p1", "p0", "p1"] and columns == {"answer": ["0", "0", "1", "1", "0", "1"]}
    assert (first.rewards, first.timeouts, first.errors) == ([0.0, 1.0, 2.0, 3.0], [1], [3])
    assert (second.rewards, second.timeouts, second.errors) == ([4.0, 5.0], [0], [])


@pytest.mark.slow
def test_agents_with_unequal_rollout_budgets_train_on_each_others_answers(tiny_agents, tmp_path, capsys):
    """`agents.0.group_size: 8` beside `rollout.group_size: 4`: llama samples 8 answers per prompt, qwen 4; each
    learner's pool holds both (its own first), the scoring matches every answer to its prompt, the groups' counts
    are unequal. Budgets equal to `rollout.group_size` give exactly the numbers of not setting them. A resume with
    another budget is refused (it changes the numbers), naming the key."""
    (tmp_path / "plain").mkdir()
    plain = pair_config(tiny_agents, tmp_path / "plain", trainer={"steps": 2})
    assert main(["train", str(plain)]) == 0
    assert main(["train", str(plain), f"trainer.output_dir={tmp_path / 'equal'}", "agents.0.group_size=4",
                 "agents.1.group_size=4"]) == 0  # fmt: skip
    assert [without_timings(r) for r in records(tmp_path / "equal")] == [
        without_timings(r) for r in records(tmp_path / "plain" / "run")
    ]
    run = tmp_path / "unequal"
    assert main(["train", str(plain), f"trainer.output_dir={run}", "agents.0.group_size=8"]) == 0
    for r in records(run):
        assert r["qwen/shared_offered"] == 2 * 8 and r["llama/shared_offered"] == 2 * 4
        assert r["llama/trained_sequences"] + r["llama/foreign_empty"] == 2 * 8 + 2 * 4
        assert 0 <= r["llama/informative_group_frac"] <= 1
    capsys.readouterr()
    assert main(["train", str(plain), f"trainer.output_dir={run}", "--resume", "trainer.steps=3"]) == 2
    assert "agents.0.group_size: 8 in the checkpoint, None now" in capsys.readouterr().err
