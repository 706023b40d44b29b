"""`rollout.backend: static`: fixed-address decoding into a preallocated KV pool, built for CUDA graphs.

One call decodes its rows, up to N = `max_new_tokens` tokens each:

1. The pool: per layer, keys and values of shape (R rows, key/value heads, L positions, head dim), allocated once
   per sampler (R: the most rows a call has asked for, a power of two; L: the agent's prompt limit + N) and only
   ever written in place, so their addresses never change. A larger call replaces it (the old one is freed first):
   one pool is held at a time.
2. Prefill: the left-padded prompts through the model with an ordinary cache, a few rows at a time, and each row's
   keys and values copied into the pool *left-aligned* (a row's token j sits at position j, its rotary position):
   no left padding in the pool.
3. Decode step (one token per row, rows 0 .. B-1 of the pool): the model with `hacrl_static_decode=True`, which
   makes each attention layer write the new key and value at the row's own position and attend to positions
   `0 .. position` of that row only (`hacrl.agent.samplers.attention`: a Triton kernel on CUDA that reads only the
   filled blocks, plain torch elsewhere). Positions and lengths are device tensors, so nothing in the step changes
   as rows grow. The next token is drawn on the device (greedy: argmax; else temperature, top-p and an
   exponential race); a row that produced a stop token feeds padding from then on. No host sync per token.
4. Continuous batching: a call takes all its rows but decodes at most `rollout.batch_size` of them together (the
   slots: pool rows). Every `sync_every` steps the host reads how many slots still run. While rows wait, those
   whose row has ended (a stop token or the length limit) take waiting rows: the prompts are prefilled straight
   into those pool rows and decode on from the next step, so a row that ends early frees its slot instead of
   leaving it idle until the batch's longest row ends (starts come in groups of at least 1 / REFILL_SHARE of
   the slots, each one prefill). Once none waits: no slot runs, the call ends; at most half run, the running rows
   are copied *within the pool* to its first rows (a power-of-two bucket, at least 2), in place: the pool keeps
   its addresses, the next steps run on fewer rows.
5. `cuda_graphs=True` compiles the decode step once with a dynamic row dimension (`mark_dynamic`, 2 .. R) and
   `mode="reduce-overhead"`, which captures one CUDA graph per row count it meets (a bucket): capturing is cheap,
   compiling is not, so a call whose rows stop at different steps adds graphs, never compilations. The pool's
   tensors are marked as static addresses (mutated in place inside the graph without a copy and without the
   "mutated inputs" skip). Each sampler compiles its own copy of the step function, so agents in one process
   never share (or exhaust) one compile cache.

Why this design rather than a compilation per bucket: one compilation of a 0.6B model took ~50 s on an H100 and
torch allows 8 per code object; a pool whose buckets are its first B rows needs none of them, and the graphs read
fixed addresses. Why rows are moved rather than indexed: a step over B rows then reads B rows' cache, contiguous.

Everything but the Triton kernel and the graph capture runs the same on the CPU, where it is tested: greedy
outputs equal `hf`'s token for token, samples follow the same distribution (the same temperature and top-p rules as
transformers' logits warpers), stops and length limits behave the same, and torch's own counters show no
recompilation across calls whose rows stop at different steps.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field

import torch
from torch import Tensor

from hacrl.agent.samplers.attention import FLAG, unsupported_reason, use_static_decode
from hacrl.agent.samplers.base import AUTO_ROWS, Sample, Sampler, SamplingAgent, next_power_of_two, pad_left

SYNC_EVERY = 8
"""Decode steps between the host's looks at how many rows are still running."""
MIN_ROWS = 2
"""The smallest row bucket: torch specialises a dimension of size 1, which would cost a compilation."""
PREFILL_TOKENS = 16384
"""Prompt tokens per prefill forward (rows x padded width): bounds the prefill's activations."""
REFILL_SHARE = 8
"""Waiting rows start in freed slots once at least 1 / REFILL_SHARE of the slots are free (or all that wait fit):
each start is one prefill forward outside the captured step (an eager pass: about the cost of a decode step or
two), so starts come in groups. Groups of k of B slots cost each row ~k / 2 idle slot-steps waiting for the group to
fill (rows end at ~B / mean-length per step) and ~B / k slot-steps of prefill: for B = 64 and 1,000-token answers,
k = B / 8 costs under ~10 % of the slot-steps (short answers pay relatively more); to be tuned on a GPU."""


def auto_rows(*, free: int, total: int, pending: int, margin: float, bytes_per_row: int) -> int:
    """`rollout.batch_size: auto` on a GPU: the largest power of two of rows whose pool fits in the free memory
    after what the update will still allocate (`pending`) and `margin` x the device's total memory. A clear error
    when not even MIN_ROWS fit."""
    budget = free - pending - int(margin * total)
    fits = budget // bytes_per_row
    if fits < MIN_ROWS:
        from hacrl.errors import ConfigError

        raise ConfigError(
            f"the static sampler's KV pool needs {bytes_per_row / 2**30:.2f} GiB per row (the prompt limit plus "
            f"max_new_tokens positions of every layer's keys and values) and {budget / 2**30:.1f} GiB are left after "
            f"the model, its pending gradients and optimizer state ({pending / 2**30:.1f} GiB) and the margin "
            f"(rollout.kv_cache_margin={margin}): lower rollout.max_new_tokens or rollout.max_prompt_tokens, "
            "rollout.kv_cache_margin, or give the agent a GPU of its own (`hacrl plan CONFIG` shows the budget)"
        )
    return 1 << (int(fits).bit_length() - 1)


class KVPool:
    """Keys and values of every layer at fixed addresses, with the one method transformers' attention layers call
    on a cache (`update`). In the decode step (`hacrl_static_decode=True`) `update` writes the new key and value of
    row b at `position_ids[b]` and returns the layer's first B rows."""

    def __init__(self, config, rows: int, length: int, device, dtype: torch.dtype) -> None:
        kv_heads, head_dim = _kv_heads_and_dim(config)
        shape = (rows, kv_heads, length, head_dim)
        self.rows, self.length = rows, length
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        for tensor in (*self.keys, *self.values):
            torch._dynamo.mark_static_address(tensor)
        self.bytes = 2 * len(self.keys) * self.keys[0].numel() * self.keys[0].element_size()
        self.no_mask = torch.ones((1, 1, 1, 1), dtype=torch.bool, device=device)
        """Passed as the 4-D attention mask of the decode step: transformers then builds none (the decode
        attention masks by length)."""

    @staticmethod
    def bytes_per_token(config, dtype: torch.dtype) -> int:
        kv_heads, head_dim = _kv_heads_and_dim(config)
        return 2 * config.num_hidden_layers * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()

    def update(self, key: Tensor, value: Tensor, layer_idx: int, kwargs=None, **_) -> tuple[Tensor, Tensor]:
        batch = key.shape[0]
        position = kwargs["position_ids"][:, 0]
        rows = torch.arange(batch, device=key.device)
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        keys[rows, :, position] = key[:, :, 0]  # index_put_ on the pool tensor itself: in place, same address
        values[rows, :, position] = value[:, :, 0]
        return keys[:batch], values[:batch]

    def load_prompt(self, layer: int, slots: Tensor, keys: Tensor, values: Tensor, pads: Tensor) -> None:
        """Pool rows `slots` from a left-padded prefill cache (B, Hkv, P, D): row b's prompt starts at column pads[b]
        there and at position 0 in pool row slots[b] (what that row held before is never read again: a decode step
        reads positions up to the one it has just written)."""
        batch, heads, width, dim = keys.shape
        index = (torch.arange(width, device=keys.device)[None, :] + pads[:, None]).clamp(max=width - 1)
        index = index[:, None, :, None].expand(batch, heads, width, dim)
        self.keys[layer][slots, :, :width] = keys.gather(2, index)
        self.values[layer][slots, :, :width] = values.gather(2, index)

    def keep_rows(self, keep: Tensor, filled: int) -> None:
        """Rows `keep` (in that order) become rows 0 .. len(keep) - 1, positions below `filled`; in place."""
        size = keep.shape[0]
        for tensor in (*self.keys, *self.values):
            tensor[:size, :, :filled] = tensor[keep, :, :filled]  # the gather copies first: overlap is safe


def _kv_heads_and_dim(config) -> tuple[int, int]:
    """Key/value heads and head dim of a transformers config (grouped-query models have fewer kv heads)."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    return kv_heads, getattr(config, "head_dim", None) or config.hidden_size // heads


def row_bytes(kv_bytes_per_token: int, positions: int, vocab: int) -> int:
    """What one row of a generation call holds: its pool row (keys and values of every position) and the
    sampling step's float32 copies of its logits (scores, probabilities, the race, the quotient: 16 bytes a
    vocabulary entry)."""
    return kv_bytes_per_token * positions + 16 * vocab


def _decode_step(
    model, pool: KVPool, token: Tensor, position: Tensor, temperature: Tensor, greedy: Tensor, top_p: float
) -> tuple[Tensor, Tensor]:
    """One token per row through the model, into and out of the pool, and the next token drawn from its logits
    (`draw`): with CUDA graphs the draw is part of the captured step, so the (rows x vocabulary) float logits never
    leave the fused kernels. Returns (next tokens, their log-probs)."""
    out = model(
        input_ids=token,
        attention_mask=pool.no_mask,
        position_ids=position,
        cache=pool,
        use_cache=True,
        **{FLAG: True},
    )
    return draw(out.logits[:, -1], temperature, greedy, top_p)


def draw(logits: Tensor, temperature: Tensor, greedy: Tensor, top_p: float) -> tuple[Tensor, Tensor]:
    """The next token of each row and its log-probability: argmax when `greedy` (a 0-d bool tensor), else a draw
    after temperature and top-p (transformers' rules; the draw follows the same distribution as `hf`'s, not the
    same random numbers). The log-prob is the drawn token's under the sampling temperature without top-p (greedy: T
    = 1). Temperature and greedy are tensors, not Python values, so a compiled step serves training's sampled and
    evaluation's greedy calls with one compilation; a greedy call draws (and discards) the random race too."""
    scores = logits.float()
    scaled = scores / torch.where(greedy, torch.ones_like(temperature), temperature)
    best = scaled.argmax(-1)
    if top_p < 1.0:
        ordered, order = torch.sort(scaled, descending=False)
        cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
        remove = cumulative <= (1 - top_p)
        remove[..., -1:] = False  # keep at least one token
        candidates = scaled.masked_fill(remove.scatter(1, order, remove), float("-inf"))
    else:
        candidates = scaled
    # the exponential race: argmax of p_i / q_i with q_i ~ Exp(1) draws i with probability p_i, like
    # torch.multinomial, but elementwise and an argmax: no host sync per token (multinomial waits on the device)
    # and it lives inside the captured graph; q is kept above zero so a p_i of 0 is never drawn
    probs = candidates.softmax(dim=-1)
    race = torch.empty_like(probs).exponential_().clamp_(min=torch.finfo(probs.dtype).tiny)
    token = torch.where(greedy, best, (probs / race).argmax(dim=-1))
    logp = torch.log_softmax(scaled, dim=-1).gather(1, token[:, None])[:, 0]
    return token, logp


def own_copy(fn, tag: str):
    """`fn` with its own code object: torch.compile keeps its compilations (and its recompile limit) per code
    object, so each sampler compiling its own copy never evicts another agent's graphs."""
    code = fn.__code__.replace(co_name=f"{fn.__name__}_{tag}")
    return types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)


class StaticSampler(Sampler):
    name = "static"

    def __init__(
        self,
        agent: SamplingAgent,
        model=None,
        *,
        cuda_graphs: bool | None = None,
        sync_every: int = SYNC_EVERY,
        compile_backend: str | None = None,
    ) -> None:
        """`compile_backend`: compile the decode step with this torch.compile backend (tests count compilations
        on the CPU with "eager"); `cuda_graphs` (default: the agent's `settings.cuda_graphs`) compiles with inductor
        and captures CUDA graphs."""
        super().__init__(agent, model)
        reason = unsupported_reason(self.model.config)
        if reason is not None:
            from hacrl.errors import ConfigError

            raise ConfigError(
                f"agent {agent.name!r}: rollout.backend=static cannot decode this model: {reason}. Use "
                "rollout.backend=hf for it (agents.<i>.rollout_backend: hf)."
            )
        self.sync_every = sync_every
        self.cuda_graphs = cuda_graphs = agent.settings.cuda_graphs if cuda_graphs is None else cuda_graphs
        self.pool: KVPool | None = None
        self._auto_rows: int | None = None
        self.stats = {"decode_steps": 0, "slot_steps": 0, "tokens": 0, "refills": 0}
        """Since the sampler was made: decode steps run, slots they computed (their rows summed), tokens kept
        (responses' lengths; each row's first comes from its prefill, the rest from decode steps, so (tokens - rows)
        / slot_steps is how busy the slots were) and prefills of waiting rows."""
        use_static_decode(self.model)
        self._step = _decode_step
        self.compiled = cuda_graphs or compile_backend is not None
        if self.compiled:
            step = own_copy(_decode_step, f"agent{agent.index}_{id(self):x}")
            if cuda_graphs:
                self._step = torch.compile(step, mode="reduce-overhead", dynamic=False)
            else:
                self._step = torch.compile(step, backend=compile_backend, dynamic=False)

    def sample_batch(
        self, rows: list[list[int]], greedy: bool, temperature: float, *, logprobs: bool = False
    ) -> list[Sample]:
        return self.sample_rows(rows, len(rows), greedy, temperature, logprobs=logprobs)

    def sample_rows(
        self, rows: list[list[int]], batch_size: int, greedy: bool, temperature: float, *, logprobs: bool = False
    ) -> list[Sample]:
        """All rows in one decode with `batch_size` slots: a row that stops frees its slot for a waiting row
        (continuous batching), so rows that end early never leave the batch running short while others wait."""
        padded = rows if len(rows) >= MIN_ROWS else rows + [rows[0]] * (MIN_ROWS - len(rows))
        tokens, lengths, finished, token_logp = self._decode(padded, greedy, temperature, logprobs, slots=batch_size)
        decode = self.agent.decode
        return [
            Sample(prompt_ids, row[:length], decode(row[:length]), done, lp[:length] if logprobs else None)
            for prompt_ids, row, length, done, lp in zip(rows, tokens, lengths, finished, token_logp, strict=False)
        ]

    def rows_per_call(self, rows: list[list[int]]) -> int:
        """`rollout.batch_size: auto`: on a GPU, `auto_rows` for a pool of the agent's prompt limit + max_new_tokens
        positions (decided once per sampler: the pool is then held for the run at fixed addresses); elsewhere 64."""
        if self.agent.device.type != "cuda":
            return min(AUTO_ROWS, max(MIN_ROWS, len(rows)))
        return min(self._auto_limit(), max(MIN_ROWS, len(rows)))

    def cap_rows(self, batch_size: int) -> int:
        return min(batch_size, self._auto_limit()) if self._auto_on_gpu() else batch_size

    def _auto_on_gpu(self) -> bool:
        """`rollout.batch_size` is auto (or unset: auto for this sampler) and the agent is on a GPU."""
        agent = self.agent
        return agent.device.type == "cuda" and agent.settings.rows_per_call == "auto"

    def _auto_limit(self) -> int:
        if self._auto_rows is None:
            agent = self.agent
            config = self.model.config
            dtype = next(self.model.parameters()).dtype
            length = agent.settings.max_tokens
            vocab = self.model.get_output_embeddings().weight.shape[0]
            per_row = row_bytes(KVPool.bytes_per_token(config, dtype), length, vocab)
            free, total = torch.cuda.mem_get_info(agent.device)
            held = self.pool.bytes if self.pool is not None else 0  # a pool it would replace
            pending = agent.optimizer.pending_bytes() if agent.optimizer is not None else 0
            margin = agent.settings.kv_cache_margin
            self._auto_rows = auto_rows(
                free=free + held, total=total, pending=pending, margin=margin, bytes_per_row=per_row
            )
        return self._auto_rows

    def _pool(self, rows: int, length: int) -> KVPool:
        """The pool, replaced (the old one freed first) only when a call needs more rows or positions."""
        agent = self.agent
        pool = self.pool
        if pool is None and self._auto_on_gpu():
            rows = max(rows, self._auto_limit())  # sized once for the run's calls, not for the first one
        if pool is None or pool.rows < rows or pool.length < length:
            rows = max(rows, pool.rows if pool else 0)
            length = max(length, agent.settings.max_tokens, pool.length if pool else 0)
            self.pool = pool = None
            if agent.device.type == "cuda":
                torch.cuda.empty_cache()
            rows = next_power_of_two(rows)
            dtype = next(self.model.parameters()).dtype
            self.pool = KVPool(self.model.config, rows, length, agent.device, dtype)
        return self.pool

    def _prefill(self, pool: KVPool, rows: list[list[int]], slots: Tensor) -> Tensor:
        """The prompts into pool rows `slots` (row i into slots[i]); the logits of each prompt's last token."""
        from transformers import DynamicCache

        agent, model = self.agent, self.model
        width = max(len(r) for r in rows)
        chunk = max(1, PREFILL_TOKENS // width)
        logits = []
        for first in range(0, len(rows), chunk):
            part = rows[first : first + chunk]
            input_ids, mask = pad_left(part, agent.pad_id, agent.device, width)
            cache = DynamicCache(config=model.config)
            out = model(
                input_ids=input_ids,
                attention_mask=mask,
                position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                cache=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            pads = width - mask.sum(-1)
            for layer, (keys, values) in enumerate(_layers(cache)):
                pool.load_prompt(layer, slots[first : first + len(part)], keys, values, pads)
            logits.append(out.logits[:, -1])
            del out, cache
        return torch.cat(logits)

    def warm_up(self, rows: int | None = None, steps: int = 4) -> float:
        """Compile the decode step and capture its graph for calls of `rows` rows (default: the rows per call that
        `rollout.batch_size: auto` chooses) before the first real call, in seconds: the run's pool is allocated as
        that call would allocate it, then `steps` tokens of `rows` one-token prompts are decoded (a real call then
        meets a compiled step and a captured graph; a smaller last batch or a compacted bucket still captures its
        own graph, which is cheap)."""
        import time

        agent = self.agent
        size = agent.settings.rows_per_call
        if rows is None and isinstance(size, int):  # a given rollout.batch_size: its calls' rows
            rows = self.cap_rows(size)
        elif rows is None:  # auto: the rows the pool is sized for on a GPU, 64 elsewhere
            rows = self._auto_limit() if self._auto_on_gpu() else AUTO_ROWS
        rows = max(MIN_ROWS, rows)
        start = time.perf_counter()
        self._pool(rows, 0)  # the pool a real call allocates: the prompt limit + max_new_tokens positions
        model = self.model
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                self._decode([[agent.pad_id]] * rows, False, agent.settings.temperature, steps=steps)
        finally:
            model.train(was_training)
        if agent.device.type == "cuda":
            torch.cuda.synchronize(agent.device)
        return time.perf_counter() - start

    def _decode(
        self,
        rows: list[list[int]],
        greedy: bool,
        temperature: float,
        logprobs: bool = False,
        steps: int | None = None,
        slots: int | None = None,
    ):
        """Every row's response: (tokens, lengths, finished, log-probs) per row. `slots` rows decode together (all
        of them by default); the others wait, and at a sync a waiting row is prefilled into the pool row of a row
        that has ended (at least a REFILL_SHARE-th of the slots at a time, or all that still wait), so the batch
        keeps its size while rows wait; once none waits, it compacts as rows end."""
        agent = self.agent
        device, steps = agent.device, steps or agent.settings.max_new_tokens
        batch = max(MIN_ROWS, min(len(rows), slots or len(rows)))
        width = max(len(r) for r in rows)
        pool = self._pool(batch, width + steps)
        draw_args = (
            torch.tensor(float(temperature), dtype=torch.float32, device=device),
            torch.tensor(bool(greedy), device=device),
        )
        first = draw(self._prefill(pool, rows[:batch], torch.arange(batch, device=device)), *draw_args,
                     agent.settings.top_p)  # fmt: skip
        state = _Slots.start(rows[:batch], *first, steps=steps, pad=agent.pad_id, logprobs=logprobs)
        run = _Run(rows, steps, torch.tensor(agent.stop_ids, device=device), width, waiting=batch)
        share = max(1, batch // REFILL_SHARE)
        it = 0
        while True:
            state.write(run.stops, agent.pad_id)
            if it >= run.deadline and run.waiting == len(rows):
                break
            if (it + 1) % self.sync_every == 0 or it >= run.deadline:
                if self._sync(pool, state, run, it, share, draw_args):
                    break
            if steps == 1:  # every row's one token came from its prefill: no decode step, only the next starts
                it += 1
                continue
            state.token, state.logp = self._run_step(pool, state.token.unsqueeze(-1), state.position, draw_args)
            self.stats["decode_steps"] += 1
            self.stats["slot_steps"] += state.size
            state.advance()
            it += 1
        state.harvest(torch.arange(state.size, device=device), run)
        tokens, lengths, done, token_logp = (list(f) for f in zip(*(run.results[r] for r in range(len(rows))),
                                                                  strict=True))  # fmt: skip
        self.stats["tokens"] += sum(lengths)
        return tokens, lengths, done, token_logp

    def _sync(self, pool: KVPool, state: _Slots, run: _Run, it: int, share: int, draw_args) -> bool:
        """The loop's only host sync, once per `sync_every` steps: a finite log-prob of every drawn token (NaN or
        +inf anywhere in a row's logits makes it NaN), then waiting rows into the slots of ended ones, or once none
        waits a compaction into a smaller bucket. True: every row has ended."""
        check = [(~state.finished).sum(), (~torch.isfinite(state.logp)).any().long(), state.position.max()]
        running, bad, reach = torch.stack(check).tolist()
        if bad:
            from hacrl.errors import NonFiniteError

            raise NonFiniteError(
                f"agent {self.agent.name!r}: the model's next-token logits hold NaN or inf while sampling (its "
                "weights or activations overflowed); lower the agent's lr, or use dtype float32 / bfloat16 "
                "instead of float16, and resume from the newest checkpoint (never written from non-finite weights)"
            )
        total = len(run.rows)
        begin = min(state.size - running, total - run.waiting)  # rows to start in freed slots
        if begin and (begin >= share or begin == total - run.waiting):
            free = state.finished.nonzero()[:, 0][:begin]
            state.harvest(free, run)
            new = run.rows[run.waiting : run.waiting + begin]
            first = draw(self._prefill(pool, new, free), *draw_args, self.agent.settings.top_p)
            state.refill(free, range(run.waiting, run.waiting + begin), new, *first, run, self.agent.pad_id)
            run.waiting, running, run.deadline = run.waiting + begin, running + begin, it + run.steps - 1
            self.stats["refills"] += 1
        if run.waiting < total:
            return False
        if running == 0:
            return True
        size = max(MIN_ROWS, next_power_of_two(running))
        if size <= state.size // 2:  # compact: the running rows, topped up with ended ones
            state.harvest(state.finished.nonzero()[:, 0], run)  # the ended rows that the compaction may drop
            keep = torch.cat([(~state.finished).nonzero()[:, 0], state.finished.nonzero()[:, 0]])[:size]
            pool.keep_rows(keep, max(reach, run.width) + 1)
            state.keep(keep)
        return False

    def _run_step(self, pool: KVPool, token: Tensor, position: Tensor, draw_args) -> tuple[Tensor, Tensor]:
        if self.compiled:
            for tensor in (token, position):  # one compilation for every row count 2 .. pool.rows
                torch._dynamo.mark_dynamic(tensor, 0, min=MIN_ROWS, max=pool.rows)
            if self.cuda_graphs:
                torch.compiler.cudagraph_mark_step_begin()  # the previous step's outputs are consumed
        return self._step(self.model, pool, token, position, *draw_args, self.agent.settings.top_p)


@dataclass
class _Run:
    """One `_decode` call's rows and its progress: `rows[waiting:]` have no slot yet; by iteration `deadline`
    every row started so far has reached the length limit; `results` holds the rows read off ended slots."""

    rows: list[list[int]]
    steps: int
    stops: Tensor
    width: int
    """The longest prompt."""
    waiting: int
    deadline: int = -1
    results: dict[int, tuple] = field(default_factory=dict)
    """row -> (tokens, length, finished, log-probs)."""

    def __post_init__(self) -> None:
        self.deadline = self.steps - 1


@dataclass
class _Slots:
    """The decode state per slot (a slot is a pool row; slots get compacted once no row waits), on the device:
    the row it decodes, its tokens so far (column `steps` takes what a slot writes after its row has ended,
    dropped) and their log-probs, its response length, whether it has ended, the column of its next token, the
    position of its next write, and the token (and its log-prob) it drew last. Updated whole by `write` (after a
    draw), `advance` (after a decode step), `refill` (waiting rows into freed slots) and `keep` (compaction)."""

    live: Tensor
    out: Tensor
    out_logp: Tensor | None
    lengths: Tensor
    finished: Tensor
    column: Tensor
    position: Tensor
    token: Tensor
    logp: Tensor
    steps: int

    @classmethod
    def start(
        cls, rows: list[list[int]], token: Tensor, logp: Tensor, *, steps: int, pad: int, logprobs: bool
    ) -> _Slots:
        """Slots 0 .. len(rows) - 1 holding `rows`, whose first tokens (from their prefill) are `token`."""
        batch, device = len(rows), token.device
        return cls(
            live=torch.arange(batch, device=device),
            out=torch.full((batch, steps + 1), pad, dtype=torch.long, device=device),
            out_logp=torch.zeros((batch, steps + 1), dtype=torch.float32, device=device) if logprobs else None,
            lengths=torch.full((batch,), steps, dtype=torch.long, device=device),
            finished=torch.zeros(batch, dtype=torch.bool, device=device),
            column=torch.zeros(batch, dtype=torch.long, device=device),
            position=torch.tensor([[len(r)] for r in rows], dtype=torch.long, device=device),
            token=token,
            logp=logp,
            steps=steps,
        )

    @property
    def size(self) -> int:
        return self.finished.shape[0]

    def write(self, stops: Tensor, pad: int) -> None:
        """The drawn tokens into their columns (an ended slot's into the dropped column, as padding); a stop token
        or the last column ends a slot's row."""
        steps = self.steps
        self.token = torch.where(self.finished, torch.full_like(self.token, pad), self.token)
        at = torch.where(self.finished, torch.full_like(self.column, steps), self.column)[:, None]
        self.out.scatter_(1, at, self.token[:, None])
        if self.out_logp is not None:  # the drawn token's log-prob at the sampling temperature (no top-p)
            self.out_logp.scatter_(1, at, self.logp[:, None])
        stopped = torch.isin(self.token, stops) & ~self.finished
        self.lengths = torch.where(stopped, self.column + 1, self.lengths)
        self.finished = self.finished | stopped | (self.column == steps - 1)
        self.column = self.column + 1

    def advance(self) -> None:
        """After a decode step: a running slot's next write moves on (an ended one stays where it stopped)."""
        self.position = self.position + (~self.finished).long().unsqueeze(-1)

    def harvest(self, index: Tensor, run: _Run) -> None:
        """The rows of slots `index` to the host, into `run.results` (at a sync: the loop waits there anyway)."""
        steps = self.steps
        done = (self.lengths[index] < steps) | torch.isin(self.out[index, steps - 1], run.stops)
        fields = [self.live[index].tolist(), self.out[index, :steps].tolist(), self.lengths[index].tolist()]
        fields.append(done.tolist())
        logps = self.out_logp[index, :steps].tolist() if self.out_logp is not None else [None] * len(fields[0])
        for row, *result in zip(*fields, logps, strict=True):
            run.results[row] = tuple(result)

    def refill(
        self, free: Tensor, row_ids: range, rows: list[list[int]], token: Tensor, logp: Tensor, run: _Run, pad: int
    ) -> None:
        """Rows `row_ids` (prompts `rows`, first tokens `token` from their prefill) into the ended slots `free`."""
        steps, device, begin = self.steps, free.device, len(rows)
        ended = torch.isin(token, run.stops) | (steps == 1)
        starts = torch.tensor([[len(r)] for r in rows], dtype=torch.long, device=device)
        self.live = self.live.index_put((free,), torch.arange(row_ids.start, row_ids.stop, device=device))
        fresh = torch.full((begin, steps + 1), pad, dtype=torch.long, device=device)
        fresh[:, 0] = token
        self.out[free] = fresh
        if self.out_logp is not None:
            fresh_logp = torch.zeros((begin, steps + 1), dtype=torch.float32, device=device)
            fresh_logp[:, 0] = logp
            self.out_logp[free] = fresh_logp
        self.lengths = self.lengths.index_put((free,), torch.where(ended, 1, steps))
        self.token, self.logp = self.token.index_put((free,), token), self.logp.index_put((free,), logp)
        self.position = self.position.index_put((free,), starts)
        self.finished = self.finished.index_put((free,), ended)
        self.column = self.column.index_put((free,), torch.ones_like(free))

    def keep(self, index: Tensor) -> None:
        """Compaction: slots `index` (in that order) become slots 0 .. len(index) - 1."""
        self.live, self.finished, self.token = self.live[index], self.finished[index], self.token[index]
        self.position, self.column, self.lengths = self.position[index], self.column[index], self.lengths[index]
        self.out = self.out[index]
        self.out_logp = self.out_logp[index] if self.out_logp is not None else None


def _layers(cache):
    """(keys, values) of each layer of a transformers DynamicCache."""
    for layer in cache.layers:
        yield layer.keys, layer.values
