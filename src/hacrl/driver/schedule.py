"""The one owner of a step's calls: which role of which agent does what, and in which order, at any lag
(`trainer.lag` = k; lag 0 is k = 0). One step, with batch t to train on (sampled k steps ago) and batch t + k to
sample (none at k = 0: the trainer samples and scores batch t just before):

    1. the proximal pass     an agent's sampler of its own computes the proximal log-probs of its learner's own rows
                             after the first mini-batch (the weights the update starts from are the ones it holds)
    2. sample t + k          every agent's sampling role: its sampler of its own, else its learner
    3. learn t               every learning role, the step's pool sent once for all (`Transport.share`)
    4. `between`             the driver's work on the new batch (its scoring), while the learners learn
    5. the weight link       the learner's weights after update t to its sampler, for a link whose two ends meet
                             (`hacrl.agent.weightsync`: a broadcast, or Ray's handed copy); shared memory is read by
                             the sampler itself just before the batch that needs it

Every call goes through a transport (`hacrl.driver.backends`), which only carries them: on Ray calls 1-3 all run at
once (an actor runs its calls in order), on the local backend the learners run in the driver while the samplers'
processes sample. A checkpoint takes each sampler's random stream into its learner's part (`save`), so a checkpoint
is the same with or without samplers and resumes either way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, TypeVar

from hacrl.core.sharing import in_pool_order
from hacrl.driver.backends import Handle, Transport, start_transport
from hacrl.messages import Completion, GenerateCall, LearnCall, Learned, SampleCall, Sampled, Trajectory, WorkerSpec

T = TypeVar("T")


class Schedule:
    """The calls of a run's steps, evaluations and checkpoints, over `transport` (started for `specs`)."""

    def __init__(self, transport: Transport, specs: Sequence[WorkerSpec]) -> None:
        self.transport, self.specs = transport, list(specs)
        self.concurrent = transport.concurrent
        self.apart = [s.placement.sampler_device is not None for s in specs]
        """Each agent: whether it has a sampler of its own."""
        self.meets = [False] * len(specs)
        """Each agent: whether its weight link's two ends meet at the step's end (the schedule runs them)."""
        what = "opening the weight link to its sampler"
        for i in (i for i, apart in enumerate(self.apart) if apart):  # the learner opens it, its sampler is given it
            link = self._call(i, "learner", "open_weight_link", (transport.across_machines,), what)
            self._call(i, "sampler", "attach_weight_link", (link,), what)
            self.meets[i] = link.meets

    @classmethod
    def start(cls, runtime, specs: Sequence[WorkerSpec]) -> Schedule:
        """Start the agents' processes on `runtime.backend` and open their weight links."""
        transport = start_transport(runtime, list(specs))
        try:
            return cls(transport, specs)
        except BaseException:
            transport.close(force=True)
            raise

    def _call(self, i: int, role: str, method: str, args: tuple, what: str) -> Any:
        return self.transport.gather([self.transport.submit(i, role, method, args, what)])[0]

    # -- a step ------------------------------------------------------------------------------------------------------

    def sample(self, calls: Sequence[SampleCall]) -> list[Sampled]:
        """Every agent's batch, on its sampling role."""
        return self.transport.gather(self._submit_samples(calls))

    def learn(self, calls: Sequence[LearnCall]) -> list[Learned]:
        """Every learner's update (lag 0: on the batch it sampled)."""
        return self.transport.gather(self._submit_learns(calls))

    def step(
        self, samples: Sequence[SampleCall], learns: Sequence[LearnCall], between: Callable[[list[Sampled]], T]
    ) -> tuple[list[Sampled], T, list[Learned]]:
        """Lag k >= 1: steps 1-5 above. `between(sampled)` runs in a thread of the driver once every sample is in,
        while the learners learn; its error comes first (the learns' own is raised after it)."""
        learns = self._with_proximal(learns)
        sampling = self._submit_samples(samples)
        learning = self._submit_learns(learns)
        sampled = self.transport.gather(sampling)
        with ThreadPoolExecutor(1, thread_name_prefix="hacrl-between") as pool:
            future = pool.submit(between, sampled)
            try:
                learned = self.transport.gather(learning)
            finally:
                extra = future.result()
        self._link(learns)
        return sampled, extra, learned

    def _submit_samples(self, calls: Sequence[SampleCall]) -> list[Handle]:
        return [
            self.transport.submit(i, "sampler", "sample", (c,), f"sampling at step {c.step}")
            for i, c in enumerate(calls)
        ]

    def _submit_learns(self, calls: Sequence[LearnCall]) -> list[Handle]:
        """The learn calls, the step's pool shared once (`Transport.share`): each learner takes its foreign answers
        from it (`AgentWorker.learn(call, pool)`) instead of its own copy of every other agent's (N copies of the
        pool, one per learner, would grow as N^2). A learner with no foreign answers (frozen, or no sharing) gets its
        call as it is."""
        union: dict[int, Trajectory] = {}
        for call in calls:
            union.update((id(t), t) for t in call.foreign)
        pool = self.transport.share(in_pool_order(union.values())) if union else None
        return [
            self.transport.submit(
                i,
                "learner",
                "learn",
                (replace(c, foreign=[]), pool) if c.foreign else (c,),
                f"learning at step {c.step}",
            )  # fmt: skip
            for i, c in enumerate(calls)
        ]

    def _with_proximal(self, learns: Sequence[LearnCall]) -> list[LearnCall]:
        """1: each learner's call, with the reply of its sampler's proximal pass where it has a sampler of its own
        and rows after its first mini-batch (the learner takes it after its first optimizer step,
        `SamplingRole.proximal`); as it was for a worker group (its ranks compute theirs) and a frozen agent."""
        out = list(learns)
        for i, call in enumerate(learns):
            spec = self.specs[i]
            first = spec.trainer.mini_batch_size
            if not self.apart[i] or spec.placement.group or spec.agent.frozen or call.rollout is None:
                continue
            if len(call.rollout.response_ids) > first:
                what = f"computing proximal log-probs for step {call.step}"
                handle = self.transport.submit(i, "sampler", "proximal", (call.step, call.rollout, first), what)
                out[i] = replace(call, proximal=handle)
        return out

    def _link(self, learns: Sequence[LearnCall]) -> None:
        """5: each meeting link's transfer of the weights after this step's update, both ends at once (the
        learner's reply is what the sampler receives: Ray hands it over by reference)."""
        handles = []
        for i, call in enumerate(learns):
            if not self.meets[i] or self.specs[i].agent.frozen:
                continue
            what = f"handing over the weights after update {call.step}"
            if self.specs[i].placement.broadcasts:  # the two ends of one collective
                receive = self.transport.submit(i, "sampler", "receive_weights", (call.step,), what)
                handles += [receive, self.transport.submit(i, "learner", "send_weights", (call.step,), what)]
            else:  # the sampler's call waits for the learner's reply, which the driver never fetches (a failure of
                # the learner's end is raised by the sampler's)
                sent = self.transport.submit(i, "learner", "send_weights", (call.step,), what)
                handles.append(self.transport.submit(i, "sampler", "receive_weights", (call.step, sent), what))
        if handles:
            self.transport.gather(handles, peers=True)

    # -- around the steps ----------------------------------------------------------------------------------------------

    def generate(self, calls: Sequence[GenerateCall], *, what: str) -> list[list[Completion]]:
        """Evaluation: each agent's learner (it holds the newest weights)."""
        return self.transport.gather([self.transport.submit(i, "learner", "generate", (c,), what)
                                      for i, c in enumerate(calls)])  # fmt: skip

    def save(self, directory: str, *, what: str) -> None:
        """Each learner saves its agent's part, a sampler's stream in it as the agent's (`AgentWorker.adopt_stream`;
        a worker group's ranks each take their own)."""
        for i in (i for i, apart in enumerate(self.apart) if apart):
            stream = self._call(i, "sampler", "stream", (), what)
            self._call(i, "learner", "adopt_stream", (stream,), what)
        self._all("learner", "save", (directory,), what)

    def load(self, directory: str) -> None:
        what = "loading its checkpoint part"
        self._all("learner", "load", (directory,), what)
        self._all("sampler", "load", (directory,), what, only=self.apart)

    def _all(self, role: str, method: str, args: tuple, what: str, only: Sequence[bool] | None = None) -> list:
        agents = [i for i in range(len(self.specs)) if only is None or only[i]]
        return self.transport.gather([self.transport.submit(i, role, method, args, what) for i in agents])

    def pids(self) -> list[int]:
        return self.transport.pids()

    def close(self, *, force: bool = False) -> None:
        self.transport.close(force=force)
