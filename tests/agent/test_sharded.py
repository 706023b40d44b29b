"""An agent on two CPU ranks (gloo, FSDP2): its update of a fixed pool equals the one-device update."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import write_config

PROMPTS = [[{"role": "user", "content": f"{a} + {b} ="}] for a, b in ((1, 2), (3, 4), (5, 1))]


def _specs(tiny_agents, tmp_path, **trainer):
    from hacrl.config import load_config
    from hacrl.messages import WorkerSpec

    trainer = {"prompts_per_step": 3, "mini_batch_size": 6, "micro_batch_size": 2, **trainer}
    cfg = load_config(
        write_config(tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], tmp_path / "run", trainer=trainer)
    )
    return [
        WorkerSpec(i, a, cfg.rollout, cfg.trainer, cfg.algorithm, torch_threads=1, num_agents=2)
        for i, a in enumerate(cfg.agents)
    ]


def _learn_on_rank(rank, world, spec, rollout, call, init, out):
    """One rank of a `world`-rank group: adopt the one-device rollout (what `sample`'s exchange would give every rank),
    learn, and (rank 0) save the gathered float32 weights, the compute copy and the metrics."""
    from hacrl.agent.distributed import RankInfo, full_state_dict
    from hacrl.agent.sharded import ShardedWorker

    worker = ShardedWorker(spec, RankInfo(rank, world, init, "cpu"))
    worker._rollout = rollout
    learned = worker.learn(call)
    state = full_state_dict(worker.agent.model, worker._copy, worker.agent.device, keep=rank == 0)
    if rank == 0:
        copy = {n: p.detach().clone() for n, p in worker._copy.named_parameters()}
        torch.save({"state": state, "copy": copy, "metrics": learned.metrics}, out)


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [1, 2])
def test_one_update_of_a_worker_group_equals_the_one_device_update(ranks, tiny_agents, tmp_path):
    """HACPO, learner qwen (BPE) with llama's (char) responses as foreign rows: 24 rows in 4 mini-batches of 6,
    split 3 + 3 over the ranks in micro-batches of 2 (so each rank runs one partly filled micro-batch); also as
    a 1-rank group (`devices: [cpu]`: FSDP2 on one device, the path of one GPU with CPU offload). The
    gradients differ from one device only in float summation order (each rank sums its rows, the ranks' sums are
    added), ~1e-7 relative; AdamW's first steps are ~lr * g / |g|, so a weight can move by up to ~lr where a
    gradient element is near zero and its sign flips. Tolerance: the gradient norm and losses to 1e-5 relative,
    every weight to lr / 100 after 4 optimizer steps (the one-device update moves weights by up to ~4 lr;
    measured: 1e-6 at lr 3e-3, i.e. lr / 3000)."""
    from dataclasses import replace

    from hacrl.agent.worker import AgentWorker
    from hacrl.driver.backends.ranks import free_port
    from hacrl.messages import LearnCall, SampleCall

    llama_spec, qwen_spec = _specs(tiny_agents, tmp_path)
    llama, qwen = AgentWorker(llama_spec), AgentWorker(qwen_spec)
    call = SampleCall(1, PROMPTS, 4)
    foreign = [replace(t, reward=float(i % 3 == 0)) for i, t in enumerate(llama.sample(call).trajectories)]
    qwen.sample(call)
    rollout = qwen._rollout
    learn = LearnCall(1, [float(i % 2) for i in range(12)], foreign, [0.4, 0.6])
    one = qwen.learn(learn)
    expected = dict(qwen.agent.model.named_parameters())

    out = tmp_path / "rank0.pt"
    spec = replace(qwen_spec, agent=replace(qwen_spec.agent, devices=["cpu"] * ranks))
    torch.multiprocessing.start_processes(
        _learn_on_rank, (ranks, spec, rollout, learn, f"tcp://127.0.0.1:{free_port()}", str(out)), nprocs=ranks,
        start_method="spawn",
    )  # fmt: skip
    got = torch.load(out, weights_only=True)
    lr = qwen_spec.agent.lr
    worst = max(float((got["state"][n] - p.detach()).abs().max()) for n, p in expected.items())
    print(f"largest weight difference, {ranks} rank(s) vs one device: {worst:.2e} (lr {lr:g})")
    for name, p in expected.items():
        diff = float((got["state"][name] - p.detach()).abs().max())
        assert diff <= lr / 100, f"{name}: the {ranks}-rank update differs by {diff:.2e} (lr {lr:g})"
        assert torch.equal(got["copy"][name], got["state"][name].to(got["copy"][name].dtype)), name
    assert one.metrics["optimizer_steps"] == got["metrics"]["optimizer_steps"] == 4
    assert set(got["metrics"]) == set(one.metrics)
    for key in sorted(one.metrics):
        assert got["metrics"][key] == pytest.approx(one.metrics[key], rel=1e-5, abs=1e-7), key
