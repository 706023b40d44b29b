"""`rollout.backend: vllm` (or `agents.<i>.rollout_backend: vllm`): an agent's answers sampled by vLLM's offline
engine, in the process that holds the agent's sampling role (its worker, or a sampler of its own).

- The engine is built from the agent's model directory's config without reading its weights (`load_format: dummy`,
  no tokenizer: hacrl renders prompts with the agent's own chat template and passes token ids), then given the
  weights of the module hacrl samples with (`refresh`, here at once: a resumed run's, a LoRA agent's merged copy),
  and again before each batch after an update, in memory (`reload_weights`, vLLM's in-place path), never through a
  file. A LoRA agent hands over its merged weights (`Agent.sampling_model` with `lora.merge_for_sampling: true`,
  which validation asks for on vLLM), so vLLM needs no LoRA support of its own, the engine stays one plain model
  however the adapters change, and its answers are those of the adapters' forward (tested). vLLM's own LoRA path
  (adapters loaded per request) would save the merge, one base-sized add per update, and is not used.
- Each row has its own seed, drawn from the agent's stream (`hacrl.seeds`, the worker's torch generator while it
  samples), so a run repeats as far as vLLM's seeded sampling does on the device: on CPU, in one process
  (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, set here unless the user set it), bit for bit between two engines of the same
  build (tests); on GPUs its batched kernels may not.
- Stops are the agent's (`stop_ids`; vLLM's own EOS rule is off), so a response runs up to and including its first
  stop token as with every sampler; the text is the agent's decoding. With `logprobs`, each token's log-prob is
  vLLM's of the sampled token after temperature (`logprobs_mode: processed_logprobs`), the behaviour policy's.
- The engine's threads: vLLM's CPU worker binds its own; the process's torch thread count is put back after the
  engine starts, for the learner's update in the same process. Its KV cache is sized from the agent's rows per call
  and token limits (`kv_cache_bytes`), not vLLM's default share of the machine. Prefills are not chunked: a chunked
  prefill's discarded token rewinds the row's seeded generator, which vLLM's CPU generators cannot (it failed at 256
  rows x 128 tokens).

Without vLLM installed, naming it stops the run before any model loads, with the install line
(`hacrl.config.validation.check_samplers_here`).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from hacrl.agent.samplers.base import AUTO_ROWS, Sample, Sampler, SamplingAgent, cut_at_stop


class VLLMSampler(Sampler):
    name = "vllm"

    def __init__(self, agent: SamplingAgent, model: Any = None) -> None:
        super().__init__(agent, model)
        self.llm = _engine(agent, self.model)
        self.refresh_s = 0.0
        """Seconds the last weight update of the engine took."""
        self.refresh()

    def sample(
        self,
        prompts: list[list[int]],
        num_samples: int,
        *,
        greedy: bool = False,
        batch_size: int | str = 256,
        temperature: float | None = None,
        logprobs: bool = False,
    ) -> list[Sample]:
        """`num_samples` answers to each prompt, prompt-major; the engine batches them itself (`batch_size` is
        vLLM's to choose: its scheduler fills its KV cache)."""
        import torch
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        settings = self.agent.settings
        rows = [p for p in prompts for _ in range(num_samples)]
        seeds = torch.randint(0, 2**31 - 1, (len(rows),)).tolist()  # the agent's stream: the run repeats
        stop = list(self.agent.stop_ids)
        params = [
            SamplingParams(
                n=1,
                temperature=0.0 if greedy else (temperature or settings.temperature),
                top_p=1.0 if greedy else settings.top_p,
                max_tokens=settings.max_new_tokens,
                seed=seed,
                logprobs=0 if logprobs else None,
                stop_token_ids=stop,
                ignore_eos=True,  # the agent's stops only, as every sampler
                detokenize=False,
            )
            for seed in seeds
        ]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=r) for r in rows], params, use_tqdm=False)
        samples = []
        for row, out in zip(rows, outputs, strict=True):
            answer = out.outputs[0]
            ids, finished = cut_at_stop(list(answer.token_ids), stop)
            values = None
            if logprobs:
                values = [step[token].logprob for step, token in zip(answer.logprobs, ids, strict=False)]
            samples.append(Sample(list(row), ids, self.agent.decode(ids), finished, values))
        return samples

    def refresh(self) -> None:
        """The module's weights into the engine, in memory (vLLM's in-place reload)."""
        start = time.perf_counter()
        state = {n: p.detach() for n, p in self.model.state_dict().items()}
        worker = self.llm.llm_engine.model_executor.driver_worker.worker
        worker.reload_weights(weights_iterator=iter(state.items()))
        self.refresh_s = time.perf_counter() - start


def kv_cache_bytes(config, dtype, rows: int, positions: int) -> int:
    """The KV cache vLLM reserves: `rows` answers of `positions` tokens (and a block of 128 more each: vLLM
    allocates whole blocks), every layer's keys and values. Sized, because vLLM's default on CPU reserves 92 % of
    the machine's memory (its `gpu_memory_utilization`), which a second engine, or the learner beside it, lacks."""
    import torch

    config = config.get_text_config()
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    per_token = config.num_hidden_layers * 2 * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()
    return rows * (positions + 128) * per_token


class _Harmless(logging.Filter):
    """vLLM's two warnings that hacrl's way of running it makes, both harmless, dropped so that a user never reads
    them as a fault: "Chat template warmup failed" with its traceback, at every engine start (the warm-up renders a
    chat through vLLM's tokenizer, which hacrl does not start: `skip_tokenizer_init`, since hacrl renders prompts
    with the agent's own template and hands vLLM token ids); and "RotaryEmbedding: Failed to load weights", at every
    weight update (a rotary embedding has no weights, only a cos/sin table vLLM computes, which the in-place reload
    keeps). The same warning of any other layer still shows."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (
            message.startswith("Chat template warmup failed")
            or (message.endswith(": Failed to load weights") and message.split(":")[0].endswith("RotaryEmbedding"))
        )


HARMLESS_FROM = ("vllm.renderers.base", "vllm.model_executor.model_loader.reload.layerwise")
"""The vLLM loggers that emit `_Harmless`'s warnings."""


def quiet_harmless_warnings() -> None:
    for name in HARMLESS_FROM:
        log = logging.getLogger(name)
        if not any(isinstance(f, _Harmless) for f in log.filters):
            log.addFilter(_Harmless())


def _engine(agent: SamplingAgent, model: Any):
    """vLLM's offline engine for the agent's architecture, its weights not read (they come from `model`)."""
    import torch

    from hacrl.config.validation import VLLM_INSTALL
    from hacrl.errors import ConfigError

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in this process: hacrl supervises its processes
    try:
        from vllm import LLM
    except ImportError:
        raise ConfigError(VLLM_INSTALL) from None
    quiet_harmless_warnings()
    settings, threads = agent.settings, torch.get_num_threads()
    directory = getattr(model, "name_or_path", None) or agent.cfg.model
    dtype = next(model.parameters()).dtype
    rows = settings.rows_per_call if isinstance(settings.rows_per_call, int) else AUTO_ROWS
    try:
        llm = LLM(model=str(directory), dtype=str(dtype).removeprefix("torch."), enforce_eager=True, seed=0,
                  load_format="dummy", skip_tokenizer_init=True, max_model_len=settings.max_tokens,
                  logprobs_mode="processed_logprobs", max_num_seqs=rows, enable_chunked_prefill=False,
                  kv_cache_memory_bytes=kv_cache_bytes(model.config, dtype, rows, settings.max_tokens))  # fmt: skip
    except Exception as e:  # noqa: BLE001 - an architecture vLLM cannot serve: named, with the fallback
        raise ConfigError(
            f"agents.{agent.index}: vLLM cannot serve the model in {str(directory)!r} ({type(e).__name__}: "
            f"{str(e).splitlines()[0][:300] if str(e) else ''}); set agents.{agent.index}.rollout_backend=hf"
        ) from e
    torch.set_num_threads(threads)
    return llm
