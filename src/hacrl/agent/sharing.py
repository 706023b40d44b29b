"""Which of the other agents' rows a learner trains on, inside its worker: the glue between a learner's pool and the
sharing policies of `hacrl.core.sharing` (docs/design.md, "Which rollouts a learner receives").

    select_pool   the learner's pool (own rows, the others' trajectories) through the policy and the budget,
                  re-tokenizing only the foreign answers kept
    keep_mask     which entries of a pool (rows, or trajectories not yet in the learner's tokens) enter the loss
    sharing_metrics   what was offered, kept and saved per source
    select_rows   both on rows in the learner's tokens: the rows that enter the loss, their advantages, the metrics
    relevance     `top_k`'s relevance of each foreign row to the learner, from one no-grad forward of its own
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from hacrl.agent.exchange import LearnerRow, learner_rows
from hacrl.agent.logprobs import TokenBatch
from hacrl.config import SharingConfig
from hacrl.core.sharing import kept_rows
from hacrl.learner import loss_inputs
from hacrl.messages import Trajectory

if TYPE_CHECKING:
    from hacrl.agent.model import Agent


def select_pool(
    agent: Agent,
    own_rows: list[LearnerRow],
    foreign: list[Trajectory],
    prompt_ids: list[list[int]],
    adv: list[float],
    capabilities: torch.Tensor,
    *,
    sharing: SharingConfig,
    r_max: float,
    names: Sequence[str],
    relevance: Callable[[list[LearnerRow]], torch.Tensor],
    rho: torch.Tensor | None = None,
) -> tuple[list[LearnerRow], list[float], dict[str, Any]]:
    """`select_rows` on `agent`'s pool of its own rows and the other agents' trajectories (`adv` over both, in pool
    order), re-tokenizing only the foreign answers it keeps (`top_k`'s relevance, `relevance(rows)`, reads them
    all): the others cost nothing, and their tokens in `shared/*/tokens_saved` are the prompt's in the learner's
    tokens + the response's in its source's."""
    learner = agent.index
    if not foreign:
        return own_rows, adv, {}
    if sharing.policy == "top_k":
        rows = [*own_rows, *learner_rows(agent, [], foreign, prompt_ids, [], [])]
        return select_rows(rows, adv, capabilities, learner=learner, sharing=sharing, r_max=r_max, names=names,
                           relevance=lambda: relevance(rows), rho=rho)  # fmt: skip
    pool = [*own_rows, *foreign]
    keep = keep_mask(pool, adv, capabilities, learner=learner, sharing=sharing, r_max=r_max,
                     relevance=lambda: None, rho=rho, names=names)  # fmt: skip

    def tokens(i: int) -> int:  # a dropped answer is never tokenized for this learner
        return len(prompt_ids[pool[i].group]) + pool[i].source_num_tokens

    shared = sharing_metrics(pool, keep, learner=learner, names=names, tokens=tokens)
    kept = [t for t, k in zip(foreign, keep[len(own_rows) :], strict=True) if k]
    rows = [*own_rows, *learner_rows(agent, [], kept, prompt_ids, [], [])]
    return rows, [a for a, k in zip(adv, keep, strict=True) if k], shared


def select_rows(
    rows: list[LearnerRow],
    adv: list[float],
    capabilities: torch.Tensor,
    *,
    learner: int,
    sharing: SharingConfig,
    r_max: float,
    names: Sequence[str],
    relevance: Callable[[], torch.Tensor],
    rho: torch.Tensor | None = None,
) -> tuple[list[LearnerRow], list[float], dict[str, Any]]:
    """The sharing policy `sharing.policy` applied to learner `learner`'s pool: the rows that enter the loss (own
    rows and the kept foreign ones, in pool order), their advantages, and per source (named by `names`): rows
    offered, kept, the kept rows' mean reward, the tokens (prompt + response, in this learner's tokens) not trained.
    `relevance()` is called for `top_k` only (it costs a forward). `sharing.budget_per_prompt` then keeps per prompt
    the foreign rows of largest |rho A| (`rho`: each source's loss coefficient for this learner; None: 1)."""
    if not any(r.source != learner for r in rows):
        return rows, adv, {}
    keep = keep_mask(rows, adv, capabilities, learner=learner, sharing=sharing, r_max=r_max, relevance=relevance,
                     rho=rho, names=names)  # fmt: skip
    metrics = sharing_metrics(rows, keep, learner=learner, names=names,
                              tokens=lambda i: _tokens(rows[i]))  # fmt: skip
    kept_rows = [i for i, k in enumerate(keep) if k]
    return [rows[i] for i in kept_rows], [adv[i] for i in kept_rows], metrics


def _tokens(row: LearnerRow) -> int:
    """A row's prompt + response tokens; 0 for a response empty in the learner's tokens (never trained anyway)."""
    return len(row.prompt_ids) + len(row.response_ids) if row.response_ids else 0


def keep_mask(
    pool: Sequence[Any],
    adv: list[float],
    capabilities: torch.Tensor,
    *,
    learner: int,
    sharing: SharingConfig,
    r_max: float,
    relevance: Callable[[], torch.Tensor],
    rho: torch.Tensor | None = None,
    names: Sequence[str] = (),
) -> list[bool]:
    """Which entries of the pool (rows or trajectories: `reward`, `group`, `source`) enter the learner's loss: the
    policy's choice, then the budget's (see `select_rows`); with `sharing.groups` (agents named by `names`) the
    budget bounds only the rows from outside the learner's group, and none of those cross without one. Only `top_k`
    needs the rows in the learner's tokens."""
    group_of = None
    if sharing.groups:
        group_index = {name: g for g, members in enumerate(sharing.groups) for name in members}
        group_of = [group_index[name] for name in names]
    return kept_rows(
        torch.tensor([r.reward for r in pool], dtype=torch.float64),
        torch.tensor([r.group for r in pool]),
        torch.tensor([r.source for r in pool]),
        torch.tensor(adv, dtype=torch.float64),
        learner=learner,
        num_agents=len(capabilities),
        sharing=sharing,
        r_max=r_max,
        rho=rho,
        relevance=relevance() if sharing.policy == "top_k" else None,
        group_of=group_of,
    ).tolist()


def sharing_metrics(
    pool: Sequence[Any], keep: list[bool], *, learner: int, names: Sequence[str], tokens: Callable[[int], int]
) -> dict[str, Any]:
    """Per source (named by `names`): rows offered, kept, the kept rows' mean reward, and `tokens(i)` summed over
    the dropped rows (what the learner did not train); their totals over the sources."""
    metrics: dict[str, Any] = {}
    for j in sorted({r.source for r in pool if r.source != learner}):
        key = f"shared/{names[j] if j < len(names) else j}"
        offered = [i for i, r in enumerate(pool) if r.source == j]
        kept = [i for i in offered if keep[i]]
        metrics[f"{key}/offered"] = len(offered)
        metrics[f"{key}/kept"] = len(kept)
        if kept:
            metrics[f"{key}/kept_reward_mean"] = sum(pool[i].reward for i in kept) / len(kept)
        metrics[f"{key}/tokens_saved"] = sum(tokens(i) for i in offered if not keep[i])
    metrics["shared_offered"] = sum(r.source != learner for r in pool)
    metrics["shared_kept"] = sum(k and r.source != learner for r, k in zip(pool, keep, strict=True))
    metrics["shared_tokens_saved"] = sum(v for k, v in metrics.items() if k.endswith("/tokens_saved"))
    return metrics


def relevance(
    rows: list[LearnerRow],
    adv: list[float],
    capabilities: torch.Tensor,
    *,
    learner: int,
    algorithm,
    params,
    mini_batch_size: int,
    batch_size: int,
    logprobs: Callable[[list[LearnerRow]], tuple[torch.Tensor, TokenBatch]],
) -> torch.Tensor:
    """`top_k`'s relevance of each foreign row to learner `learner`: |sum_t d objective / d log pi(y_t)|, the pull the
    row would exert on the learner's token log-probs at the optimizer step m it has under `all` (its position in the
    pool // `mini_batch_size`), with the pre-update weights (`logprobs(rows)`: one no-grad forward over the foreign
    rows, `batch_size` at a time). For HACPO with a token-mean ratio: rho * |A| * s**(1 + alpha) inside the clip
    window [lo_m, 1], 0 outside, so the rows that carry gradient come first. Own rows 0; foreign rows empty in this
    learner's tokens -1 (they never enter a loss)."""
    out = torch.zeros(len(rows), dtype=torch.float64)
    foreign = [i for i, r in enumerate(rows) if r.source != learner]
    for i in foreign:
        if not rows[i].response_ids:
            out[i] = -1.0
    foreign = [i for i in foreign if rows[i].response_ids]
    params = replace(params, kl_coef=0.0)  # the KL term reads own rows only
    for start in range(0, len(foreign), batch_size):
        chunk = foreign[start : start + batch_size]
        logp, tb = logprobs([rows[i] for i in chunk])
        for m in sorted({i // mini_batch_size for i in chunk}):
            sel = [c for c, i in enumerate(chunk) if i // mini_batch_size == m]
            batch = [rows[chunk[c]] for c in sel]
            leaf = logp[sel].detach().float().requires_grad_(True)
            with torch.enable_grad():
                inputs = loss_inputs(batch, leaf, tb.response_mask[sel], torch.zeros_like(leaf),
                                     [adv[chunk[c]] for c in sel], learner, capabilities,
                                     check_values=False)  # fmt: skip
                loss = algorithm.loss(inputs, params=params, step_index=m).loss
                (grad,) = torch.autograd.grad(loss, leaf)
            pull = (grad * tb.response_mask[sel]).sum(-1).abs().double().cpu() * len(sel)  # the loss is a mean
            for c, value in zip(sel, pull.tolist(), strict=True):
                out[chunk[c]] = value
    return out
