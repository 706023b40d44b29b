"""`rollout.backend: hf`: transformers' `generate` with a KV cache, one call per batch of rows.

The GenerationConfig is built here in full, so a model directory's own generation_config (top_k=50, repetition
penalties, ...) never changes what hacrl samples.
"""

from __future__ import annotations

from hacrl.rollout import Sample, cut_at_stop, pad_left
from hacrl.samplers import Sampler


class HFSampler(Sampler):
    name = "hf"

    def sample_batch(self, rows: list[list[int]], greedy: bool, temperature: float) -> list[Sample]:
        from transformers import GenerationConfig

        agent = self.agent
        config = GenerationConfig(
            do_sample=not greedy,
            temperature=temperature if not greedy else None,
            top_p=agent.top_p if not greedy else None,
            top_k=0 if not greedy else None,
            max_new_tokens=agent.max_new_tokens,
            eos_token_id=agent.stop_ids,
            pad_token_id=agent.pad_id,
            use_cache=True,
        )
        input_ids, attention_mask = pad_left(rows, agent.pad_id, agent.device)
        out = agent.model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
        samples = []
        for prompt_ids, tokens in zip(rows, out[:, input_ids.shape[1] :].tolist(), strict=True):
            response, finished = cut_at_stop(tokens, agent.stop_ids)
            samples.append(Sample(prompt_ids, response, agent.decode(response), finished))
        return samples
