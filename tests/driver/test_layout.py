"""`trainer.mini_batch_layout` (issue 85): which rows share an optimizer step. `mixed` gives every step the same
share of each source's rows; it equals `blocks` where the pool has one source, changes the steps where it has
several, keeps a lagged update's proximal pass right (a sampler of its own changes nothing), and a resume refuses a
change of layout."""

from __future__ import annotations

import random

import pytest

from hacrl.learner import mini_batches
from tests.conftest import fails_cleanly, records, same_numbers, same_weights, write_config

GRADED = {"function": "tests.reward_fixtures:digits"}


def test_every_row_is_in_one_step_and_each_step_holds_each_sources_share():
    rng = random.Random(0)
    for _ in range(300):
        counts = [rng.randint(0, 12) for _ in range(rng.randint(1, 4))]
        sources = [s for s, n in enumerate(counts) for _ in range(n)]
        if not sources:
            continue
        size = rng.randint(1, 8)
        blocks, mixed = mini_batches(sources, size), mini_batches(sources, size, "mixed")
        assert len(mixed) == len(blocks) == -(-len(sources) // size)
        assert sorted(i for step in mixed for i in step) == list(range(len(sources)))
        for step in mixed:  # sources in pool order inside a step, each source's rows consecutive
            assert step == sorted(step)
        for s, n in enumerate(counts):  # each step holds floor(n / M) or one more of source s's rows
            shares = [sum(sources[i] == s for i in step) for step in mixed]
            assert max(shares, default=0) - min(shares, default=0) <= 1 and sum(shares) == n
        if len({*sources}) == 1 and len(sources) % size == 0:
            assert mixed == blocks
    assert mini_batches([0] * 8 + [1] * 8 + [2] * 8, 8, "mixed") == [
        [0, 1, 8, 9, 16, 17],
        [2, 3, 4, 10, 11, 12, 18, 19, 20],
        [5, 6, 7, 13, 14, 15, 21, 22, 23],
    ]
    with pytest.raises(ValueError, match="blocks, mixed"):
        mini_batches([0, 1, 1], 1, "other")


def _config(tiny_agents, run, names=("llama", "qwen"), **sections):
    sections.setdefault("scoring", GRADED)
    trainer = {"steps": 2, **sections.pop("trainer", {})}
    return write_config(run.with_suffix(".yaml"), tiny_agents, list(names), run, trainer=trainer, **sections)


@pytest.mark.slow
def test_mixed_equals_blocks_with_one_source_and_differs_with_several(tiny_agents, tmp_path):
    from hacrl.tools.cli import main

    def run(name, layout, **sections):
        out = tmp_path / name
        cfg = _config(tiny_agents, out, **sections)
        assert main(["train", str(cfg), f"trainer.mini_batch_layout={layout}"]) == 0
        return out

    alone = {"names": ("qwen",), "algorithm": {"name": "gspo"}}
    same_numbers(records(run("gspo-blocks", "blocks", **alone)), records(run("gspo-mixed", "mixed", **alone)))
    off = {"algorithm": {"name": "hacpo", "share_rollouts": False}}
    blocks, mixed = run("off-blocks", "blocks", **off), run("off-mixed", "mixed", **off)
    same_numbers(records(blocks), records(mixed))
    same_weights(blocks, mixed, 2)
    shared_blocks, shared_mixed = run("hacpo-blocks", "blocks"), run("hacpo-mixed", "mixed")
    a, b = records(shared_blocks)[-1], records(shared_mixed)[-1]
    assert a["qwen/optimizer_steps"] == b["qwen/optimizer_steps"] == 4  # 16 rows, 4 a step: as many steps
    assert a["qwen/loss"] != b["qwen/loss"]  # foreign rows now in every step, under every bound
    assert a["qwen/foreign_lower_bound"] > b["qwen/foreign_lower_bound"]  # blocks: only the later, higher bounds


@pytest.mark.slow
def test_a_lagged_mixed_update_is_the_same_with_its_proximal_pass_on_a_sampler_of_its_own(
    tiny_agents, tmp_path, capsys
):
    """With `mixed` the first step holds only part of the own rows: every own row gets the proximal pass (the plan
    says so), whether the learner makes it or its sampler does; a resume with the other layout is refused."""
    import yaml

    from hacrl.tools.cli import main

    def run(name, apart):
        out = tmp_path / name
        cfg = _config(tiny_agents, out, trainer={"steps": 3, "lag": 1, "mini_batch_layout": "mixed"})
        if apart:
            data = yaml.safe_load(cfg.read_text())
            data["agents"][1]["sampler_devices"] = ["cpu"]
            cfg.write_text(yaml.safe_dump(data))
        assert main(["train", str(cfg)]) == 0
        return out, cfg

    (learner, cfg), (sampler, _) = run("learner", False), run("sampler", True)
    same_numbers(records(learner), records(sampler))
    same_weights(learner, sampler, 3)
    fails_cleanly(capsys, ["train", str(cfg), "trainer.steps=4", "trainer.mini_batch_layout=blocks", "--resume"],
                  "trainer.mini_batch_layout: 'mixed' in the checkpoint, 'blocks' now")  # fmt: skip


@pytest.mark.slow
def test_a_median_centred_window_trains_resumes_exactly_and_logs_its_centre(tiny_agents, tmp_path):
    """`algorithm.foreign_center: median` through `hacrl train`: the pre-update pass over the foreign rows gives each
    source's centre (`foreign_center`, the mean shift), the losses differ from the paper's window, and a run stopped
    a step early and resumed ends as the straight one. `hacrl control` takes it too."""
    from hacrl.tools.cli import main
    from tests.conftest import assert_resumes_exactly

    def make(run, center="median"):
        return _config(tiny_agents, run, algorithm={"name": "hacpo", "foreign_center": center},
                       trainer={"steps": 3})  # fmt: skip

    full, _ = assert_resumes_exactly(make, tmp_path, steps=3)
    paper = tmp_path / "paper"
    assert main(["train", str(make(paper, "none"))]) == 0
    centred, plain = records(full)[-1], records(paper)[-1]
    assert all(f"{n}/foreign_center" in centred and f"{n}/foreign_center" not in plain for n in ("llama", "qwen"))
    assert centred["qwen/foreign_center"] < 0  # a partner's answers are less likely for it than for their source
    assert centred["qwen/loss"] != plain["qwen/loss"]
    control = tmp_path / "control"
    assert main(["control", "configs/control.yaml", "trainer.initial_states_per_step=2", "trainer.group_size=4",
                 "trainer.mini_batch_size=4", "trainer.steps=1", "eval.every=0", "logging.console=false",
                 "logging.tensorboard=false", "algorithm.foreign_center=median",
                 f"trainer.output_dir={control}"]) == 0  # fmt: skip
    assert "mlp-full/foreign_center" in records(control)[-1]
