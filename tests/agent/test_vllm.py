"""`rollout.backend: vllm` (issue 74) on vLLM's CPU build with the real model (SmolLM2-135M-Instruct, from the
package registry): its answers, their log-probs, its seeds and its weight updates. These run where vLLM is installed
(`make test-vllm`: .venv-vllm, which `make test` sets up and runs); elsewhere the module is skipped."""

from __future__ import annotations

import copy
import math
import statistics

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed here: `make test-vllm` runs these in .venv-vllm")

pytestmark = pytest.mark.slow

PAIRS = ((3, 4), (12, 30), (7, 8), (21, 5), (9, 9), (40, 2), (17, 26), (5, 60))
PROMPTS = [[{"role": "user", "content": f"What is {a} + {b}? Put the answer in \\boxed{{}}."}] for a, b in PAIRS]


def _worker(smollm2, tmp_path, backend: str, *, max_new_tokens: int = 48, lora: dict | None = None):
    import yaml

    from hacrl.agent.worker import AgentWorker
    from hacrl.config import load_config
    from hacrl.messages import WorkerSpec
    from tests.conftest import write_config

    path = write_config(tmp_path / f"{backend}{'-lora' if lora else ''}.yaml", {"smol": smollm2["dir"]}, ["smol"],
                        tmp_path / "run", algorithm={"name": "gspo"},
                        rollout={"group_size": 4, "max_new_tokens": max_new_tokens, "max_prompt_tokens": 96,
                                 "backend": backend},
                        trainer={"prompts_per_step": 8, "mini_batch_size": 32, "micro_batch_size": 8,
                                 "old_logprobs": "sampler"})  # fmt: skip
    if lora:
        written = yaml.safe_load(path.read_text())
        written["agents"][0]["lora"] = lora
        path.write_text(yaml.safe_dump(written))
    config = load_config(path)
    return AgentWorker(WorkerSpec(0, config.agents[0], config.rollout, config.trainer, config.algorithm,
                                  torch_threads=2))  # fmt: skip


@pytest.fixture(scope="module")
def engine(smollm2, tmp_path_factory):
    """One vLLM worker for the module (an engine takes ~13 s to build here); a test that changes its weights puts
    the model's own back before it ends."""
    return _worker(smollm2, tmp_path_factory.mktemp("vllm"), "vllm")


def test_vllm_answers_as_every_sampler_with_the_log_probs_of_a_float32_forward(engine):
    """Each answer runs up to and including its first stop token (finished) or to the length limit; its text is the
    agent's decoding; the log-prob vLLM reports for each sampled token is a float32 forward's at the sampling
    temperature, within 2e-4 (measured: 6.3e-5 on 64 answers of 32 tokens)."""
    from hacrl.agent.logprobs import rows_logprobs
    from hacrl.messages import SampleCall

    engine.sample(SampleCall(1, PROMPTS[:4], 4))
    samples = engine._rollout.samples
    stop = engine.agent.stop_ids
    for s in samples:
        assert s.text == engine.agent.decode(s.response_ids) and len(s.logprobs) == len(s.response_ids)
        assert s.finished == (s.response_ids[-1] in stop) and (s.finished or len(s.response_ids) == 48)
        assert not any(t in stop for t in s.response_ids[:-1])
    logp, batch = rows_logprobs(engine.agent, samples, chunk_size=None)
    worst = max(float((logp[i][batch.response_mask[i]] - torch.tensor(s.logprobs)).abs().max())
                for i, s in enumerate(samples))  # fmt: skip
    assert worst < 2e-4, worst


def test_the_same_stream_gives_the_same_answers_and_an_update_reaches_the_engine(engine, smollm2, tmp_path):
    """Each row's seed comes from the agent's stream: a second engine on the same stream samples the same answers.
    After an update (in memory, no file), the engine samples other answers, and exactly those of a fresh engine
    given the updated weights. Neither the engine's start nor an update prints vLLM's two harmless warnings (issue
    87.18: a "Chat template warmup failed" traceback, "RotaryEmbedding: Failed to load weights"); another layer's
    would still show."""
    import logging

    from hacrl.messages import SampleCall

    class Seen(logging.Handler):  # what vLLM's own handler (on the `vllm` logger) is handed
        def __init__(self) -> None:
            super().__init__(logging.DEBUG)
            self.messages: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.messages.append(record.getMessage())

    seen = Seen()
    logging.getLogger("vllm").addHandler(seen)

    def texts(worker, stream):
        worker.sampling.streams[0] = copy.deepcopy(stream)
        return [t.text for t in worker.sample(SampleCall(2, PROMPTS[:4], 4)).trajectories]

    fresh = _worker(smollm2, tmp_path, "vllm")
    stream = copy.deepcopy(fresh.sampling.streams[0])
    before = texts(engine, stream)
    assert texts(fresh, stream) == before
    own = copy.deepcopy(engine.agent.model.state_dict())
    try:
        torch.manual_seed(0)
        with torch.no_grad():
            for name, p in engine.agent.model.named_parameters():
                if name.endswith("mlp.down_proj.weight"):
                    p.add_(0.05 * torch.randn_like(p))
        engine.agent.weights_changed()
        after = texts(engine, stream)
        assert after != before and engine.agent.sampler.refresh_s > 0
        with torch.no_grad():
            for (_, p), (_, q) in zip(fresh.agent.model.named_parameters(), engine.agent.model.named_parameters(),
                                      strict=True):  # fmt: skip
                p.copy_(q)
        fresh.agent.weights_changed()
        assert texts(fresh, stream) == after
        told = "\n".join(seen.messages)
        assert "Reloading and processing weights took" in told  # vLLM's log is on, and an update ran
        assert "Chat template warmup failed" not in told and "RotaryEmbedding: Failed" not in told
        layerwise = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
        layerwise.warning("%s: Failed to load weights", "QKVParallelLinear")
        assert seen.messages[-1] == "QKVParallelLinear: Failed to load weights"
    finally:  # the module's engine back to the model's own weights, for the tests after this one
        logging.getLogger("vllm").removeHandler(seen)
        engine.agent.model.load_state_dict(own)
        engine.agent.weights_changed()


def test_a_lora_agent_hands_vllm_the_base_with_its_adapters_merged(engine, smollm2, tmp_path):
    """vLLM samples a plain model: a LoRA agent (`lora.merge_for_sampling: true`, which validation asks for with
    vLLM) gives it its merged copy. Before any update the adapters are zero, so it samples what the plain engine
    samples on the same stream; after its adapters change, other answers, and exactly those of the plain engine
    given the merged weights."""
    from hacrl.messages import SampleCall

    def texts(worker, stream):
        worker.sampling.streams[0] = copy.deepcopy(stream)
        return [t.text for t in worker.sample(SampleCall(2, PROMPTS[:4], 4)).trajectories]

    lora = _worker(smollm2, tmp_path, "vllm", lora={"r": 4, "alpha": 8, "merge_for_sampling": True})
    stream = copy.deepcopy(lora.sampling.streams[0])
    plain = copy.deepcopy(engine.agent.model.state_dict())
    before = texts(lora, stream)
    assert texts(engine, stream) == before
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in lora.agent.model.named_parameters():
            if "lora_B" in name:
                p.add_(0.05 * torch.randn_like(p))
    lora.agent.weights_changed()
    after = texts(lora, stream)
    assert after != before
    try:
        engine.agent.model.load_state_dict(lora.agent.sampling_model.state_dict())
        engine.agent.weights_changed()
        assert texts(engine, stream) == after
    finally:  # the module's engine back to the model's own weights
        engine.agent.model.load_state_dict(plain)
        engine.agent.weights_changed()


def test_vllm_and_hf_sample_the_same_distribution(engine, smollm2, tmp_path):
    """64 answers to the same 8 prompts from each sampler at T = 1 (the model's own weights; the module's engine,
    whose stream other tests have moved on, and a fresh `hf` worker: other seeds): their mean reward
    (the math verifier on the prose: the right sum in the last box), length and finished fraction agree within 4
    standard errors of the difference (a two-sample z-test that a sampler ignoring the temperature, the stops or the
    chat template fails by tens of standard errors)."""
    from hacrl.messages import SampleCall
    from hacrl.tasks.rewards import math_reward

    verifier, gold = math_reward(), [str(a + b) for a, b in PAIRS for _ in range(8)]
    out, rewards = {}, {}
    for backend in ("vllm", "hf"):
        worker = engine if backend == "vllm" else _worker(smollm2, tmp_path, backend)
        worker.sample(SampleCall(1, PROMPTS, 8))
        out[backend] = worker._rollout.samples
        rewards[backend] = verifier(PROMPTS, [s.text for s in out[backend]], answer=gold)
    assert 0 < statistics.fmean(rewards["vllm"]) < 1  # the test can tell (measured: 9 % and 11 % right)
    a, b = rewards["vllm"], rewards["hf"]
    print(f"mean reward: vLLM {statistics.fmean(a):.3f}, hf {statistics.fmean(b):.3f} (64 answers each)")
    se = math.sqrt(statistics.pvariance(a) / len(a) + statistics.pvariance(b) / len(b))
    assert abs(statistics.fmean(a) - statistics.fmean(b)) / se < 4, (statistics.fmean(a), statistics.fmean(b))
    for name, value in (("length", lambda s: len(s.response_ids)), ("finished", lambda s: float(s.finished))):
        a, b = ([value(s) for s in out[k]] for k in ("vllm", "hf"))
        se = math.sqrt(statistics.pvariance(a) / len(a) + statistics.pvariance(b) / len(b)) or 1e-9
        z = abs(statistics.fmean(a) - statistics.fmean(b)) / se
        assert z < 4, (name, statistics.fmean(a), statistics.fmean(b), z)


def _train_pair(smollm2, tiny_agents, tmp_path, run, *, faults: str = "", resume: bool = False, smol=None,
                own_process: bool = True, **sections):  # fmt: skip
    """`hacrl train` on SmolLM2 (on vLLM; `smol`: more of its settings) and the tiny Qwen2 (on hf), two HACPO steps
    of `tests.conftest.write_config`'s small config (`sections`: more of its settings, group by group): in a process
    of its own (`own_process`; one that `faults` can kill), else in this one (which has imported torch, transformers and
    vLLM already: ~12 s less a run)."""
    import contextlib
    import io
    import os
    import subprocess
    import sys
    from pathlib import Path
    from types import SimpleNamespace

    import yaml

    from hacrl.tools.cli import main
    from tests.conftest import write_config

    cfg = write_config(tmp_path / f"{run.name}.yaml", {"smol": smollm2["dir"], "qwen": tiny_agents["qwen"]},
                       ["smol", "qwen"], run)  # fmt: skip
    written = yaml.safe_load(cfg.read_text())
    written["agents"][0].update(lr=1e-5, rollout_backend="vllm", **(smol or {}))
    for group, values in sections.items():
        written[group].update(values)
    cfg.write_text(yaml.safe_dump(written))
    args = ["train", str(cfg), *(["--resume"] if resume else [])]
    if not own_process:
        assert not faults, "a run with failpoints runs in a process of its own"
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(args)
        return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())
    env = {**os.environ, "HACRL_FAULTS": faults, "OMP_NUM_THREADS": "2"}
    root = Path(__file__).resolve().parents[2]
    return subprocess.run([sys.executable, "-m", "hacrl", *args], env=env, cwd=root, capture_output=True, text=True,
                          timeout=900)  # fmt: skip


def test_a_hacpo_run_with_a_vllm_sampler_process_is_the_learners_own_and_resumes_exactly_after_a_kill(
    smollm2, tiny_agents, tmp_path
):
    """Two HACPO steps through `hacrl train` at `trainer.lag: 1`: SmolLM2 sampled by vLLM (`old_logprobs: auto`, so
    `corrected`: its rows weighted by the behaviour ratio) beside a tiny Qwen2 on `hf`, each training on the other's
    answers, checkpointed every step. The reference samples with the learner's own engine; the run gives SmolLM2 a
    sampler process of its own (`sampler_devices: [cpu]`: its own engine, the learner's weights over the weight
    link after each update, the proximal pass for its learner), is killed (SIGKILL) in the middle of SmolLM2's
    second update and resumed: every logged number and both agents' saved weights equal the reference's (the
    engines' rows are seeded from the agent's stream, which checkpoints hold, and a resumed engine is given the
    checkpoint's weights)."""
    import signal

    from tests.conftest import records, same_numbers, same_weights

    def train(run, smol=None, faults: str = "", resume: bool = False, own_process: bool = True):
        return _train_pair(smollm2, tiny_agents, tmp_path, run, smol=smol, trainer={"lag": 1}, faults=faults,
                           resume=resume, own_process=own_process, rollout={"group_size": 2})  # fmt: skip

    reference, run, apart = tmp_path / "reference", tmp_path / "run", {"sampler_devices": ["cpu"]}
    done = train(reference, own_process=False)  # in this process: only the killed run needs one of its own
    assert done.returncode == 0, done.stderr[-3000:]
    # 4 micro-batches an update (2 prompts x 2 answers: 4 own + 4 foreign rows, 2 a micro-batch; half the rows of
    # the default group of 4, for time): step 1 takes hits 1-8, hit 11 is the third micro-batch of SmolLM2's second
    # update
    killed = train(run, apart, "update.micro_batch:11")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert [r["step"] for r in records(run)] == [1]
    resumed = train(run, apart, resume=True, own_process=False)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout
    same_numbers(records(run), records(reference))
    same_weights(run, reference, 2, names=("smol", "qwen"))
    last = records(run)[-1]
    assert "smol/time/weight_sync" in last and "qwen/behaviour_weight_mean" in last
    assert last["smol/behaviour_weight_mean"] == pytest.approx(1.0, abs=0.05)  # one update at lr 1e-5; float32


def test_a_model_vllm_cannot_serve_is_named_with_the_fallback(smollm2, monkeypatch):
    """vLLM refusing the model (here: its engine raising as for an unknown architecture) stops the run with one
    message naming the agent's model and the fallback to set."""
    from types import SimpleNamespace

    import vllm
    from transformers import AutoConfig

    from hacrl.agent.samplers.vllm import _engine
    from hacrl.errors import ConfigError

    def refuse(**kwargs):
        raise ValueError("Model architectures ['FooForCausalLM'] are not supported for now.")

    monkeypatch.setattr(vllm, "LLM", refuse)
    model = torch.nn.Linear(2, 2)
    model.name_or_path, model.config = str(smollm2["dir"]), AutoConfig.from_pretrained(smollm2["dir"])
    settings = SimpleNamespace(rows_per_call=8, max_tokens=64)
    agent = SimpleNamespace(settings=settings, index=1, cfg=SimpleNamespace(model=str(smollm2["dir"])))
    with pytest.raises(ConfigError, match=r"agents\.1: vLLM cannot serve the model in .*FooForCausalLM.*"
                                          r"agents\.1\.rollout_backend=hf"):  # fmt: skip
        _engine(agent, model)


def test_a_static_partner_is_refused_here_before_any_model_loads(tmp_path, capsys):
    """Issue 87.17, in the environment that met it (vLLM's transformers, older than the static sampler's 5.20): a vLLM
    agent beside a `static` one stops before anything loads, naming the version, instead of an AttributeError at the
    first sample."""
    from importlib.metadata import version

    from packaging.version import Version

    from hacrl.tools.cli import main
    from tests.conftest import write_config

    if Version(version("transformers")) >= Version("5.20"):
        pytest.skip("this environment's transformers runs the static sampler")
    model = tmp_path / "none"
    cfg = write_config(tmp_path / "c.yaml", {"a": model, "b": model}, ["a", "b"], tmp_path / "run")
    assert main(["train", str(cfg), "agents.0.rollout_backend=vllm", "agents.1.rollout_backend=static"]) == 2
    err = capsys.readouterr().err
    assert "samples with the static sampler, which needs transformers >= 5.20" in err and "Traceback" not in err
    assert f"this environment has {version('transformers')}" in err


def test_hacrl_never_imports_vllm_unless_an_agent_samples_with_it(tmp_path):
    """With vLLM installed, the CLI, the trainer and every other sampler load without it."""
    import subprocess
    import sys

    code = ("import sys, hacrl.tools.cli, hacrl.driver.trainer, hacrl.agent.samplers.hf, hacrl.agent.samplers.static, "
            "hacrl.agent.worker; print(sorted(m for m in sys.modules if m.split('.')[0] == 'vllm'))")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr[-2000:]
