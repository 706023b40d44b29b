"""Samplers: how an agent generates responses. `rollout.backend` (or `agents.<i>.rollout_backend`) picks one by name.

    hf      transformers' `generate` with a dynamic KV cache (the CPU default; what hacrl always did)
    static  a preallocated KV cache and a fixed-shape decode step: sampling on the device without a host sync per
            token, finished rows dropped from the batch in power-of-two buckets, the whole batch stopping when every
            row has finished; `rollout.cuda_graphs` captures its decode step as a CUDA graph (GPU); its decode
            attention over the filled part of the pool is `attention`
    vllm    vLLM's offline engine (an optional extra), given the agent's weights in memory after each update

Every sampler keeps one contract (`Sampler.sample` -> `hacrl.agent.samplers.base.Sample`): a response runs up to
and including its first stop token (the agent's EOS and the model's other EOS ids), `finished` says whether it
ended there, the text is decoded with special tokens dropped; it honours the agent's temperature, top-p and
length limit. A sampler decodes with the module it is given (the agent's model, or its sampling copy:
`hacrl.agent.model.SamplingCopy`); `refresh` is called before sampling when the weights changed since the last
call (`Agent.sync_sampling_weights`; a no-op for `hf` and `static`, which read the module in place; `vllm` loads
the new weights into its engine).

Implementations load lazily: naming one imports its module.
"""

from __future__ import annotations

import importlib

from hacrl.agent.samplers.base import AUTO_ROWS, Sample, Sampler, SamplingAgent

__all__ = ["AUTO_ROWS", "SAMPLERS", "Sample", "Sampler", "SamplingAgent", "make_sampler"]

SAMPLERS = {
    "hf": "hacrl.agent.samplers.hf:HFSampler",
    "static": "hacrl.agent.samplers.static:StaticSampler",
    "vllm": "hacrl.agent.samplers.vllm:VLLMSampler",
}


def make_sampler(name: str, agent: SamplingAgent, model=None) -> Sampler:
    """Sampler `name` for `agent`, decoding with `model` (None: `agent.model`)."""
    target = SAMPLERS.get(name)
    if target is None:
        from hacrl.errors import ConfigError

        raise ConfigError(f"rollout backend {name!r} is not one of {sorted(SAMPLERS)}")
    module, _, cls = target.partition(":")
    return getattr(importlib.import_module(module), cls)(agent, model)
