"""An agent on CPU ranks (gloo, FSDP2): its update of a fixed pool equals the one-device update, in float32 and in
bfloat16 with float32 masters."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import write_config

PROMPTS = [[{"role": "user", "content": f"{a} + {b} ="}] for a, b in ((1, 2), (3, 4), (5, 1))]


def _specs(tiny_agents, tmp_path, sharing=None, **trainer):
    from hacrl.config import load_config
    from hacrl.messages import WorkerSpec

    trainer = {"prompts_per_step": 3, "mini_batch_size": 6, "micro_batch_size": 2, **trainer}
    cfg = load_config(
        write_config(tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], tmp_path / "run", trainer=trainer,
                     sharing=sharing or {})
    )  # fmt: skip
    return [
        WorkerSpec(i, a, cfg.rollout, cfg.trainer, cfg.algorithm, torch_threads=1, num_agents=2, sharing=cfg.sharing,
                   agent_names=("llama", "qwen"))
        for i, a in enumerate(cfg.agents)
    ]  # fmt: skip


def _learn_on_rank(rank, world, spec, rollout, call, init, out):
    """One rank of a `world`-rank group: adopt the one-device rollout (what `sample`'s exchange would give every rank),
    learn, and (rank 0) save the gathered float32 weights, the compute copy and the metrics."""
    import faulthandler

    from hacrl.agent.distributed import RankInfo, full_state_dict
    from hacrl.agent.worker import AgentWorker

    faulthandler.enable(all_threads=True)  # a native abort prints every thread's Python stack into the test's stderr
    worker = AgentWorker(spec, rank=RankInfo(rank, world, init, "cpu"))
    worker._rollout = rollout
    learned = worker.learn(call)
    state = full_state_dict(worker.agent.model, worker.agent.sampling_model, worker.agent.device, keep=rank == 0)
    if rank == 0:
        copy = {n: p.detach().clone() for n, p in worker.agent.sampling_model.named_parameters()}
        torch.save({"state": state, "copy": copy, "metrics": learned.metrics}, out)
    _leave_as_a_rank_does()


def _leave_as_a_rank_does() -> None:
    """No rank leaves while another is still in a collective; the group is torn down and the process ends with
    `os._exit`, as a run's rank does (`ranks._serve`, then multiprocessing's forked child exits with `os._exit`). A
    spawned process would otherwise finalize the interpreter and run C++ static destructors while gloo's and torch's
    threads still run. CI saw rank 1 abort twice ("terminate called without an active exception", SIGABRT; the second
    time with the barrier and destroy already in place), not reproduced in 44 two-rank runs on a loaded machine; taken
    to be the exit (a rank's work before it is deterministic): if it recurs, faulthandler's stacks say where."""
    import os
    import sys

    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("ranks", "dtype", "policy"),
    [(1, "float32", "all"), (2, "float32", "all"), (2, "bfloat16", "all"), (2, "float32", "top_k")],
)
def test_one_update_of_a_worker_group_equals_the_one_device_update(ranks, dtype, policy, tiny_agents, tmp_path):
    """HACPO, learner qwen (BPE) with llama's (char) responses as foreign rows: 24 rows in 4 mini-batches of 6,
    split 3 + 3 over the ranks in micro-batches of 2 (so each rank runs one partly filled micro-batch); also as
    a 1-rank group (`devices: [cpu]`: FSDP2 on one device, the path of one GPU with CPU offload). The
    gradients differ from one device only in float summation order (each rank sums its rows, the ranks' sums are
    added), ~1e-7 relative; AdamW's first steps are ~lr * g / |g|, so a weight can move by up to ~lr where a
    gradient element is near zero and its sign flips. Tolerance: the gradient norm and losses to 1e-5 relative,
    every weight to lr / 100 after 4 optimizer steps (the one-device update moves weights by up to ~4 lr;
    measured: 1e-6 at lr 3e-3, i.e. lr / 3000). In bfloat16 the group (float32 master shards, bf16 compute through
    FSDP2's mixed-precision policy, float32 reductions) is compared with the one-device agent's float32 masters
    (`MasterStep`): both round the same masters to bf16 for the forward, so they differ by bf16 summation order in
    the backward, which flips AdamW's near-zero steps on a few elements (up to ~lr each per step): the update's
    cosine with the one-device update > 0.99 and its norm within 2 %, every weight within 8 lr, metrics to 1e-2
    relative (measured: cosine 0.9998, norm ratio 0.99996, largest weight difference 4 lr, metrics within 5e-4)."""
    from dataclasses import replace

    from hacrl.agent.distributed import free_port
    from hacrl.agent.worker import AgentWorker
    from hacrl.messages import LearnCall, SampleCall

    llama_spec, qwen_spec = _specs(tiny_agents, tmp_path, sharing={"policy": policy, "k": 2})
    qwen_spec = replace(qwen_spec, agent=replace(qwen_spec.agent, dtype=dtype))
    llama, qwen = AgentWorker(llama_spec), AgentWorker(qwen_spec)
    call = SampleCall(1, PROMPTS, 4)
    foreign = [replace(t, reward=float(i % 3 == 0)) for i, t in enumerate(llama.sample(call).trajectories)]
    qwen.sample(call)
    rollout = qwen._rollout
    learn = LearnCall(1, [float(i % 2) for i in range(12)], foreign, [0.4, 0.6])
    one = qwen.learn(learn)
    masters = qwen.agent.trained_state_dict()  # bfloat16: the float32 masters; float32: the parameters themselves
    expected = {n: masters[n] if masters else p for n, p in qwen.agent.model.named_parameters()}

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
    if dtype == "bfloat16":  # the update's direction and size, against the one-device masters' update
        from safetensors.torch import load_file

        start = load_file(tiny_agents["qwen"] / "model.safetensors")
        one_step = torch.cat([(expected[n].detach() - start[n].float()).flatten() for n in expected])
        group_step = torch.cat([(got["state"][n] - start[n].float()).flatten() for n in expected])
        cosine = float(torch.nn.functional.cosine_similarity(one_step, group_step, dim=0))
        ratio = float(group_step.norm() / one_step.norm())
        print(f"bf16 update: cosine {cosine:.5f}, norm ratio {ratio:.5f}")
        assert cosine > 0.99 and abs(ratio - 1) < 0.02, (cosine, ratio)
    weights, metrics = (lr / 100, 1e-5) if dtype == "float32" else (8 * lr, 1e-2)
    for name, p in expected.items():
        diff = float((got["state"][name] - p.detach()).abs().max())
        assert diff <= weights, f"{name}: the {ranks}-rank update differs by {diff:.2e} (lr {lr:g})"
        assert torch.equal(got["copy"][name], got["state"][name].to(got["copy"][name].dtype)), name
    # all: 24 rows in 4 mini-batches; top_k (k = 2 of llama's 4 rows per prompt, relevance from each rank's
    # gathered copy): 12 own + 6 foreign rows in 3
    assert one.metrics["optimizer_steps"] == got["metrics"]["optimizer_steps"] == (4 if policy == "all" else 3)
    assert set(got["metrics"]) == set(one.metrics)
    for key in sorted(k for k in one.metrics if not k.startswith("time/")):
        assert got["metrics"][key] == pytest.approx(one.metrics[key], rel=metrics, abs=1e-7), key


def test_a_rank_that_cannot_write_its_optimizer_shard_raises_its_own_error(tmp_path, monkeypatch):
    """Found by the chaos soak (issue 87.16): a full disk while a worker group wrote its sharded optimizer state came
    back as torch's CheckpointException, a BaseException that no `except Exception` took, so the run ended in a
    traceback (exit 1). The rank's own OSError is raised instead, which the one error path names (the disk, where
    the run continues from)."""
    import errno

    import torch.distributed.checkpoint.filesystem as filesystem

    from hacrl.agent.distributed import save_optimizer_tensors

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(filesystem, "_write_files_from_queue", full)
    with pytest.raises(OSError) as raised, pytest.warns(UserWarning, match="torch.distributed is disabled"):
        save_optimizer_tensors({"w/exp_avg": torch.zeros(3)}, tmp_path / "optimizer")
    assert raised.value.errno == errno.ENOSPC
