"""Every metric a run logs, in one registry: its key, what it means and how it is reduced.

Keys in `metrics.jsonl` and TensorBoard have three shapes:

    <agent>/<name>         a training metric of one agent      (`llama/reward_mean`, `qwen/rho/llama`)  AGENT
    eval/<agent>/<name>    its evaluation, alone on the eval split (`eval/llama/pass@1`)                 EVAL
    <name>                 a metric of the whole step           (`time/step`)                            STEP

Names with a parameter are written with it in braces: `rho/{agent}`, `time/{phase}`, `avg@{k}`. The trainer builds
keys with `agent_key` / `eval_key`; the logger, `hacrl plot`, the demo summary and the benchmarks read them with the
same functions, and `parse` names any key's metric. A metric that is not here is a test failure
(`unknown_keys` over a real run's records), never a failure of a user's run.

The learner's loss metrics are reduced over an update's micro- and mini-batches by the kind `hacrl.core.metrics`
declares for them (`part`, `own`, `foreign`, `values`); `Metric.kind` reads it from there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    name: str
    doc: str

    @property
    def kind(self) -> str:
        """How it is reduced: the kind `hacrl.core.metrics.METRIC_KINDS` declares for a loss metric (the
        percentiles `<stem>_p{q}` of a `values` metric `<stem>s` are `values`), else `value` (once per step)."""
        from hacrl.core.metrics import METRIC_KINDS  # (torch: only when asked)

        stem = self.name.removesuffix("_p{q}") + "s" if self.name.endswith("_p{q}") else self.name
        return METRIC_KINDS.get(stem, "value")


def _table(*rows: tuple[str, str]) -> dict[str, Metric]:
    return {name: Metric(name, doc) for name, doc in rows}


AGENT = _table(
    # the agent's own responses of the step (the driver)
    ("reward_mean", "mean reward of its own responses"),
    ("accuracy", "share of its own responses with reward r_max"),
    ("success_frac", "hacrl control: share of its own episodes that ended within env.success_distance of the goal"),
    (
        "unstable_episodes",
        "hacrl control, env.name=reach: its own episodes whose physics went unstable (ended there, reward 0)",
    ),
    (
        "contact_episodes",
        "hacrl control, env.name=reach: its own episodes in which the arm's links touched (they never do at the start)",
    ),
    (
        "mapped/{agent}/kept",
        "hacrl control, reach: that policy's episodes (another platform) replayed on its arm within "
        "mapping.error_bound, in its pool",
    ),
    (
        "mapped/{agent}/filtered",
        "hacrl control, reach: that policy's episodes whose replay strayed past "
        "mapping.error_bound or went unstable (left out)",
    ),
    (
        "mapped/{agent}/error_mean",
        "hacrl control, reach: mean mapping error (m: the largest fingertip distance to the "
        "source's path) of that policy's replays",
    ),
    ("mapped/{agent}/error_max", "hacrl control, reach: the largest mapping error of that policy's replays (m)"),
    ("mapped/{agent}/reward_gap", "hacrl control, reach: mean |reward of a kept replay - its source episode's|"),
    (
        "mapping/inverse_error",
        "hacrl control, mapping learned: its inverse model's mean squared action error on this "
        "step's own transitions, before it is refitted on them (held out)",
    ),
    ("mapping/inverse_fit_error", "hacrl control, mapping learned: the same after the refit (in sample)"),
    (
        "replay/offered",
        "hacrl control, sharing.replay: the other policies' buffered episodes of the drawn initial states",
    ),
    ("replay/kept", "hacrl control, sharing.replay: foreign rows of the drawn initial states in its loss"),
    ("replay/age_mean", "hacrl control, sharing.replay: mean age (steps) of the drawn initial states"),
    (
        "replay/below_frac",
        "hacrl control, sharing.replay: share of its buffered foreign rows whose ratio s is below "
        "1 - delta at the start of its update (no gradient in its first mini-batch)",
    ),
    ("replay/fresh/below_frac", "hacrl control, sharing.replay: the same share among the step's own foreign rows"),
    ("replay/ratio_p50", "hacrl control, sharing.replay: median ratio s of its buffered foreign rows at the start"),
    ("capability", "P_hat, its capability estimate after this step (spec 3.1)"),
    ("response_length_mean", "mean length of its responses, in its own tokens"),
    ("finished_frac", "share of its responses that ended with EOS"),
    ("informative_group_frac", "share of its prompts whose G rewards are not all equal"),
    ("rho/{agent}", "rho, the coefficient of the other agent's rows in its loss (1 with capability_coef off; hacpo)"),
    ("reward_timeouts", "its responses whose scoring ran past scoring.timeout"),
    ("reward_errors", "its responses whose scoring raised or whose scoring process died (reward 0)"),
    ("time/busy_{phase}", "seconds its worker computed in the step's sampling / update phase (its call, start to end)"),
    (
        "time/wait_{phase}",
        "seconds it waited in the sampling / update phase for the slowest agent (hacrl.driver.pace; on the local "
        "backend, which runs agents one after another, the wait it would have with a device of its own); "
        "trainer.lag > 0: wait_step, the step's length less its sampling and update (no barrier between them)",
    ),
    (
        "time/{phase}",
        "seconds its worker spent in a phase: generate, logprobs, update; offload: moving gradients "
        "to the host and weights back in its update (agents.<i>.offload); update_saved_est: the update seconds "
        "its sharing policy saved, estimated as time/update x tokens saved / tokens trained; weight_sync: with a "
        "sampler of its own, writing its new weights for it after the update plus the sampler's read of them",
    ),
    # its update (the worker)
    ("loss", "loss (policy + KL), mean over mini-batches"),
    ("policy_loss", "policy loss, mean over mini-batches"),
    ("kl", "k3 KL to the frozen reference over own rows (when a reference is kept)"),
    ("own_ratio_mean", "mean sequence ratio s of its own rows"),
    ("own_clip_frac", "share of own rows whose clipped term is taken (GRPO: of own tokens)"),
    ("foreign_ratio_mean", "mean sequence ratio s of foreign rows"),
    (
        "behaviour_weight_mean",
        "trainer.lag > 0 or trainer.old_logprobs=corrected: mean weight min(exp(l_prox - l_behav), "
        "algorithm.behaviour_cap) of its own rows (sampled by older weights, or by another engine)",
    ),
    ("behaviour_capped_frac", "the same rows: share of its own rows whose behaviour weight is capped"),
    (
        "sampler_logp_gap",
        "mean |difference| a token between the log-probs its sampler reported and its learner's own pass under the "
        "same weights, where both were computed (a vLLM agent's recomputed rows; trainer.old_logprobs)",
    ),
    ("sampler_logp_gap_max", "the largest such |difference| of the step"),
    ("foreign_clip_frac", "share of foreign rows outside [lo_m, 1]"),
    ("foreign_below_frac", "share of foreign rows with s < lo_m"),
    ("foreign_above_frac", "share of foreign rows with s > 1"),
    ("foreign_lower_bound", "lo_m, the foreign rows' lower clip, averaged over their mini-batches"),
    ("rho_foreign_mean", "mean rho over foreign rows"),
    ("foreign_center", "algorithm.foreign_center=median: the mean over foreign rows of their source's median log s"),
    ("foreign_ratio_p{q}", "the 10th, 50th and 90th percentile of the foreign rows' ratios s"),
    ("grad_norm", "mean gradient norm (before clipping) over the optimizer steps taken"),
    ("skipped_steps", "mini-batches whose gradient was not finite: no optimizer step (spec 3.6)"),
    ("optimizer_steps", "optimizer steps taken in this update (mini-batches with a finite gradient)"),
    ("zero_grad_skipped", "mini-batches whose gradient was exactly zero, not stepped (`trainer.zero_grad_step: skip`)"),
    ("trained_sequences", "rows that entered its loss (rows empty in its tokens cannot)"),
    ("trained_tokens", "tokens (prompt + response, in its tokens) of the rows that entered its loss"),
    ("shared/{agent}/offered", "that agent's rows offered to its pool this step (sharing.policy decides)"),
    ("shared/{agent}/kept", "that agent's rows its sharing policy let into its loss"),
    ("shared/{agent}/kept_reward_mean", "mean reward of the kept rows of that agent (absent when none was kept)"),
    (
        "shared/{agent}/tokens_saved",
        "tokens of that agent's rows left out of its loss: the prompt in its own tokens + "
        "the response in the source's (a dropped answer is never re-tokenized; top_k: the response in its own)",
    ),
    ("shared_offered", "foreign rows offered to its pool, all sources"),
    ("shared_kept", "foreign rows kept by its sharing policy, all sources"),
    ("shared_tokens_saved", "tokens of foreign rows left out of its loss, all sources"),
    ("foreign_length_mean", "mean length of foreign rows in its tokens"),
    ("foreign_cut_frac", "share of foreign rows cut to its rollout.max_new_tokens"),
    ("foreign_empty", "foreign rows empty in its tokens (left out of the loss)"),
    ("advantage_abs_mean", "mean |advantage| over its pool"),
)

EVAL = _table(
    ("pass@1", "greedy accuracy: share of eval prompts whose greedy answer gets reward r_max"),
    ("success", "hacrl control: share of held-out initial states whose greedy episode succeeds"),
    ("reward_mean", "mean greedy reward"),
    ("avg@{k}", "share of k sampled answers per prompt with reward r_max (eval.num_samples = k)"),
    ("length_mean", "mean greedy answer length, in its own tokens"),
    ("finished", "share of greedy answers that ended with EOS"),
    ("reward_timeouts", "eval answers whose scoring ran past scoring.timeout"),
    ("pass@{k}", "share of prompts with at least one of k sampled answers right (eval.num_samples = k)"),
    ("{benchmark}/pass@1", "greedy accuracy on a named benchmark (eval.benchmarks)"),
    ("{benchmark}/reward_mean", "mean greedy reward on a benchmark"),
    ("{benchmark}/avg@{k}", "mean accuracy of k sampled answers per benchmark prompt"),
    ("{benchmark}/pass@{k}", "share of a benchmark's prompts with at least one of k sampled answers right"),
    ("{benchmark}/length_mean", "mean greedy answer length on a benchmark"),
    ("{benchmark}/finished", "share of greedy answers on a benchmark that ended with EOS"),
    ("{benchmark}/reward_timeouts", "benchmark answers whose scoring ran past scoring.timeout"),
)

STEP = _table(
    ("time/step", "seconds of the step: sampling + scoring + update"),
    (
        "time/{phase}",
        "seconds of a phase of the step on the driver: sampling, scoring, update; offload: the agents' "
        "offload seconds, summed (part of update). trainer.lag > 0: sampling lasts until every agent has sampled "
        "the new batch, update the rest of the step; scoring_overlapped: the new batch's scoring, inside update; "
        "fill: the first step's sampling and scoring of batches 1..k",
    ),
    ("time/idle_frac", "idle worker-seconds / worker-seconds of the sampling and update phases (hacrl.driver.pace)"),
    (
        "time/critical_path",
        "seconds of the step with each agent on devices of its own: slowest sampling + scoring + slowest update",
    ),  # fmt: skip
    ("tokens_per_second/sampling", "response tokens of all agents per second of the sampling phase"),
    ("foreign_ratio_mode", "algorithm.foreign_ratio, logged when agents share"),
)

PHASES = {
    "agent": (
        "generate",
        "logprobs",
        "update",
        "offload",
        "update_saved_est",
        "busy_sampling",
        "busy_update",
        "wait_sampling",
        "wait_update",
        "wait_step",
        "weight_sync",
    ),
    "step": ("sampling", "scoring", "update", "offload", "idle_frac", "critical_path", "fill", "scoring_overlapped"),
}


def agent_key(agent: str, name: str) -> str:
    """`<agent>/<name>`: a training metric of one agent."""
    return f"{agent}/{name}"


def eval_key(agent: str, name: str) -> str:
    """`eval/<agent>/<name>`: an evaluation metric of one agent."""
    return f"eval/{agent}/{name}"


def _patterns(table: dict[str, Metric]) -> list[tuple[re.Pattern, Metric]]:
    """The names with a parameter (`rho/{agent}`) as regexes, the parameter one path component."""
    return [
        (re.compile(re.sub(r"\\\{\w+\\\}", r"[^/]+", re.escape(name))), metric)
        for name, metric in table.items()
        if "{" in name
    ]


_PATTERNS = {id(table): _patterns(table) for table in (AGENT, EVAL, STEP)}


def _match(table: dict[str, Metric], name: str) -> Metric | None:
    if name in table:
        return table[name]
    return next((metric for pattern, metric in _PATTERNS[id(table)] if pattern.fullmatch(name)), None)


def parse(key: str) -> tuple[str, str | None, Metric] | None:
    """(scope `agent` / `eval` / `step`, the agent's name or None, the metric) of a logged key; None: unknown.

    >>> scope, agent, metric = parse("eval/qwen/avg@8")
    >>> scope, agent, metric.name
    ('eval', 'qwen', 'avg@{k}')
    >>> parse("qwen/rho/llama")[2].name, parse("time/step")[0], parse("qwen/nonsense")
    ('rho/{agent}', 'step', None)
    """
    if key == "step":
        return None
    step_metric = _match(STEP, key)
    if step_metric is not None:
        return "step", None, step_metric
    head, _, rest = key.partition("/")
    if head == "eval":
        agent, _, name = rest.partition("/")
        metric = _match(EVAL, name)
        return ("eval", agent, metric) if metric and agent else None
    metric = _match(AGENT, rest)
    return ("agent", head, metric) if metric and head else None


def scope(key: str) -> str | None:
    """`agent`, `eval` or `step` for a logged key; None for `step` itself and unknown keys."""
    parsed = parse(key)
    return parsed[0] if parsed else None


def unknown_keys(record: dict[str, object]) -> list[str]:
    """The keys of a `metrics.jsonl` record that name no registered metric (`step` is the record's own)."""
    return [key for key in record if key != "step" and parse(key) is None]


def agent_values(records: list[dict], agent: str, name: str) -> list[tuple[int, float]]:
    """(step, value) of one agent's training metric over the records that hold it."""
    key = agent_key(agent, name)
    return [(r["step"], r[key]) for r in records if key in r]


def eval_values(records: list[dict], agent: str, name: str = "pass@1") -> list[tuple[int, float]]:
    """(step, value) of one agent's evaluation metric over the records that hold it."""
    key = eval_key(agent, name)
    return [(r["step"], r[key]) for r in records if key in r]


def agents_in(records: list[dict], scope: str = "agent") -> list[str]:
    """The agents that have metrics of `scope` in the records, in the order first seen."""
    seen: dict[str, None] = {}
    for record in records:
        for key in record:
            parsed = parse(key)
            if parsed is not None and parsed[0] == scope and parsed[1] is not None:
                seen.setdefault(parsed[1], None)
    return list(seen)
