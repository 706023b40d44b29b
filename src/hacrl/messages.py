"""The seam between the driver and the agent workers: every call and every result, typed, in one module both sides
import (it imports nothing of hacrl but the config's dataclasses).

    driver -> worker                                    worker -> driver
    WorkerSpec (once, to build it)                      WorkerInfo
    SampleCall(step, prompts, group_size)               Sampled(trajectories, generate_s, logprobs_s, span, rollout)
    LearnCall(step, rewards, foreign, capabilities,     Learned(metrics, update_s)
              rollout)
    GenerateCall(prompts, num_samples, greedy, seed)    list[Completion]
    save(directory) / load(directory)                   nothing
    an agent with a sampler of its own (`hacrl.agent.sampling`), between its two roles:
    proximal(step, rollout)  (sampler)                  ProximalLogprobs (`hacrl.provenance`)
    send_weights(step)  (learner)                       what its weight link sends: receive_weights(step, sent)

After `sample` a worker keeps its responses' token ids, old log-probs and its own trajectories; at lag 0 its
`LearnCall` brings only what is new to it: the rewards of its own responses (in the order it sampled them) and,
when the algorithm shares, the other agents' scored trajectories (`foreign`, or the step's whole pool sent once for
every learner: `AgentWorker.learn(call, pool)`). No tensor crosses: text, numbers (float lists) and paths, so the same
calls work in the driver's process, in a rank's process and in a Ray actor (`hacrl.driver.backends`). The one
exception is a weight link's transfer from an agent's learner to its sampler (`hacrl.agent.weightsync`), which the
driver passes on unread (a reference on Ray).

With `trainer.lag` > 0 a batch is trained k steps after it was sampled: the worker hands its own rollout over
(`Sampled.rollout`: token ids and the sampling weights' log-probs, as lists) and the driver gives it back with the
batch's `LearnCall` (the one thing that comes back to the worker that made it); in between it lives in the driver,
and in every checkpoint (`pending.pt`). With a sampler of its own a learner's call may also carry a `Deferred`: the
reply of its sampler's proximal pass, which the learner takes during its update.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from hacrl.config import AgentConfig, AlgorithmConfig, RolloutConfig, SharingConfig, TrainerConfig
from hacrl.config.settings import Placement


@dataclass(frozen=True)
class Trajectory:
    """One response, as every agent may see it (spec 2, step 5): tokenizer-neutral."""

    group: int
    """Index of its prompt in the step (the advantage's group id; each learner renders that prompt with its own
    template)."""
    text: str
    """Decoded response text (special tokens dropped)."""
    reward: float
    """Its score; NaN in a worker's `Sampled` (the driver scores the text)."""
    source: int
    """Agent id that generated it."""
    source_logp_sum: float
    """Sum of the source's pre-update per-token log-probs of its response (EOS included); NaN when no other
    learner reads it (a single agent, or no sharing)."""
    source_num_tokens: int
    """Number of response tokens in the source's tokenization."""
    finish_reason: str
    """`eos` or `length`."""
    num_bytes: int
    """UTF-8 bytes of `text` (the `bytes` foreign-ratio normalisation, spec 3.4b)."""

    @property
    def response_bytes(self) -> int:
        """b(y): the response text's UTF-8 byte count, at least 1 (EOS is not text)."""
        return max(1, self.num_bytes)


@dataclass(frozen=True)
class Completion:
    """One generated response, as evaluation sees it."""

    text: str
    num_tokens: int
    finished: bool


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs to build itself (picklable: it travels to a Ray actor)."""

    index: int
    agent: AgentConfig
    rollout: RolloutConfig
    trainer: TrainerConfig
    algorithm: AlgorithmConfig
    weights_from: str | None = None
    """A checkpoint's model directory of this agent to start from (resume); None: `agent.model`."""
    torch_threads: int | None = None
    """torch intra-op threads of the worker's process; None: leave the process's setting."""
    host_memory: str = "keep"
    """What the worker's process does with host memory it frees (`runtime.host_memory`, `hacrl.agent.host_memory`)."""
    eval_batch_size: int = 64
    """Prompts per generation batch during evaluation."""
    num_agents: int = 1
    """Agents in the run (whether others will read this agent's log-prob sums)."""
    sharing: SharingConfig = field(default_factory=SharingConfig)
    """Which of the other agents' rows this learner trains on (`hacrl.core.sharing`)."""
    agent_names: tuple[str, ...] = ()
    """Every agent's name, by index (names the sources in its sharing metrics); empty: the indices."""

    @property
    def placement(self) -> Placement:
        """Where the agent's roles run (its worker or worker group, a sampler of its own, the weight link)."""
        return Placement.resolve(self.agent)


@dataclass(frozen=True)
class WorkerInfo:
    """What a started worker reports about itself."""

    name: str
    device: str
    pid: int


@dataclass(frozen=True)
class SampleCall:
    """Sample `group_size` responses to each prompt of training step `step` (spec 2, steps 1 and 3)."""

    step: int
    prompts: list[list[dict[str, str]]]
    group_size: int


@dataclass(frozen=True)
class OwnRollout:
    """An agent's own responses of one step in its tokens, for an update `trainer.lag` steps later."""

    step: int
    prompt_ids: list[list[int]]
    """The agent's rendering of each prompt of the step."""
    response_ids: list[list[int]]
    """Each response's sampled ids (prompt-major, as `Sampled.trajectories`)."""
    behaviour_logp: list[list[float]]
    """Each response's per-token log-probs under the weights that sampled it (float32 values)."""
    trajectories: list[Trajectory]


@dataclass(frozen=True)
class Sampled:
    """A worker's responses of one step (prompt-major, unscored) and how long it took."""

    trajectories: list[Trajectory]
    generate_s: float
    """Seconds spent generating."""
    logprobs_s: float
    """Seconds spent on the pre-update log-prob pass (0 with trainer.old_logprobs=sampler)."""
    span: tuple[float, float]
    """Wall-clock (time.time()) start and end of the call, to see whether workers overlapped."""
    rollout: OwnRollout | None = None
    """With `trainer.lag` > 0: the rollout the worker does not keep (the driver gives it back in the `LearnCall`)."""
    sync_s: float = 0.0
    """Seconds a sampler of its own spent taking the learner's new weights before sampling (`sampler_devices`)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """What the sampling measured, logged under the agent's name (`sampler_logp_gap`, where it was computed)."""


@dataclass
class ScoreResult:
    """The verifier's scores of one agent's `Sampled`, in its order (`hacrl.driver.scoring`); under `trainer.lag`
    held with it until trained on, and in `pending.pt`."""

    rewards: list[float]
    timeouts: list[int] = field(default_factory=list)
    """Indexes of completions whose scoring ran past `reward_timeout` (they got `reward_on_timeout`)."""
    errors: list[int] = field(default_factory=list)
    """Indexes where a built-in scorer raised or its process died (they got 0)."""


class Deferred(Protocol):
    """A reply another role sends later (a transport's handle: `hacrl.driver.backends.Handle`): `value()` waits for
    it, once; it is asked for inside the call that carries it."""

    def value(self) -> Any: ...


@dataclass(frozen=True)
class LearnCall:
    """Update on this step's pool: the worker's own responses, now scored, then the foreign ones (spec 2, step 5)."""

    step: int
    rewards: list[float]
    """The reward of each of the worker's own responses, in the order `Sampled.trajectories` gave them."""
    foreign: list[Trajectory]
    """The other agents' scored trajectories this learner trains on, sources in config order, for a caller that
    gives them itself; the trainer leaves it empty and sends the step's pool once beside the call instead
    (`AgentWorker.learn(call, pool)` takes its foreign rows from it)."""
    capabilities: list[float]
    """P_hat of every agent after this step's update (spec 3.1)."""
    rollout: OwnRollout | None = None
    """With `trainer.lag` > 0: the learner's own rollout of this batch (`Sampled.rollout`); None: the one it kept."""
    proximal: Deferred | None = None
    """With `trainer.lag` > 0 and a sampler of its own: the reply of its sampler's proximal pass (`value()`: a
    `hacrl.provenance.ProximalLogprobs`, the own rows after the first mini-batch by index, which the sampler computes
    while the first mini-batch trains: its weights are the ones this update starts from); None: the learner makes
    the pass itself (its `LogprobPlan` says which)."""


@dataclass(frozen=True)
class Learned:
    """One learner's update: its metrics (`hacrl.driver.metrics.LEARNER` names) and its duration."""

    metrics: dict[str, float]
    update_s: float
    span: tuple[float, float] = (0.0, 0.0)
    """Wall-clock (time.time()) start and end of the call: how long the worker was busy (`hacrl.driver.pace`)."""


@dataclass(frozen=True)
class GenerateCall:
    """Completions for evaluation: greedy, or sampled from a stream seeded by `seed` (never the training one)."""

    prompts: list[list[dict[str, str]]]
    num_samples: int
    greedy: bool
    seed: int | None = None
