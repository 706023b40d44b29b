"""`rollout.backend: hf`: transformers' `generate` with a KV cache, one call per batch of rows.

The GenerationConfig is built here in full, so a model directory's own generation_config (top_k=50, repetition
penalties, ...) never changes what hacrl samples. With `logprobs`, a logits processor applies the temperature
itself (generate's own temperature is then 1, so the order of processors does not matter), keeps that step's
log-softmax and reads off the token drawn from it at the next step: the sampled tokens' log-probs at no extra
forward, in the memory of one (rows x vocabulary) tensor. top-p must be off for those (the config refuses it).
"""

from __future__ import annotations

import torch

from hacrl.agent.samplers.base import Sample, Sampler, cut_at_stop, pad_left


class _TokenLogprobs:
    """A logits processor that scales the raw scores by 1 / temperature (the same division transformers' own
    temperature warper does) and records the log-prob of each drawn token: at step t it stores the log-softmax of
    the scaled scores, at step t + 1 it gathers the token that was drawn (the last column of `input_ids`); `finish`
    reads the last step's tokens."""

    def __init__(self, temperature: float | None) -> None:
        self.temperature = temperature
        self.previous: torch.Tensor | None = None
        self.columns: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.previous is not None:
            self.columns.append(self.previous.gather(1, input_ids[:, -1:])[:, 0])
        if self.temperature is not None:
            scores = scores / self.temperature
        self.previous = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def finish(self, last_tokens: torch.Tensor) -> torch.Tensor:
        """(rows, generated tokens): the log-prob of every drawn token, the last step's included."""
        self.columns.append(self.previous.gather(1, last_tokens[:, None])[:, 0])
        self.previous = None
        return torch.stack(self.columns, dim=1)


class HFSampler(Sampler):
    name = "hf"

    def sample_batch(
        self, rows: list[list[int]], greedy: bool, temperature: float, *, logprobs: bool = False
    ) -> list[Sample]:
        from transformers import GenerationConfig, LogitsProcessorList

        agent = self.agent
        recorder = _TokenLogprobs(None if greedy else temperature) if logprobs else None
        config = GenerationConfig(
            do_sample=not greedy,
            temperature=(1.0 if recorder else temperature) if not greedy else None,  # the recorder applies it
            top_p=agent.settings.top_p if not greedy else None,
            top_k=0 if not greedy else None,
            max_new_tokens=agent.settings.max_new_tokens,
            eos_token_id=agent.stop_ids,
            pad_token_id=agent.pad_id,
            use_cache=True,
        )
        input_ids, attention_mask = pad_left(rows, agent.pad_id, agent.device)
        out = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            generation_config=config,
            **({"logits_processor": LogitsProcessorList([recorder])} if recorder else {}),
        )
        generated = out[:, input_ids.shape[1] :]
        token_logp = recorder.finish(generated[:, -1]).tolist() if recorder else None
        samples = []
        for i, (prompt_ids, tokens) in enumerate(zip(rows, generated.tolist(), strict=True)):
            response, finished = cut_at_stop(tokens, agent.stop_ids)
            row_logp = token_logp[i][: len(response)] if token_logp is not None else None
            samples.append(Sample(prompt_ids, response, agent.decode(response), finished, row_logp))
        return samples
