"""An agent: a Hugging Face causal LM with its tokenizer, chat template, optimizer and sampling settings.

Choices:
1. Models and tokenizers load from local directories only (`local_files_only=True`): nothing is downloaded.
2. A directory with `tokenizer.json` loads through `PreTrainedTokenizerFast`: `AutoTokenizer` would swap a
   locally trained tokenizer for the class named in the model's config (e.g. Qwen2Tokenizer) and change its
   behaviour. Other tokenizers load through `AutoTokenizer`.
3. Prompts are rendered with the agent's own chat template (generation prompt on, per-agent template kwargs),
   then tokenized without adding special tokens again; too-long prompts are cut from the left.
4. Response text from another agent is tokenized with `split_special_tokens=True`: text that looks like a
   control token stays plain text and can never become one (spec 2, step 5b).
"""

from __future__ import annotations

from pathlib import Path

import torch

from hacrl.agent.precision import HOST, MasterStep, ParameterStep
from hacrl.config import AgentConfig, RolloutConfig
from hacrl.config.settings import AgentSettings, Precision, Role
from hacrl.errors import ModelError, first_line
from hacrl.model_dirs import refuse_model_code, require_model_dir, tokenizer_dir

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "tiktoken.model")
"""A directory holds a tokenizer when it has at least one of these."""


def load_tokenizer(path: str | Path, *, key: str = "tokenizer"):
    """The tokenizer of a local directory; `key` names the config key in error messages."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    path = tokenizer_dir(path, key)  # a GGUF agent's: its converted directory's copy (`hacrl.gguf`)
    if not path.is_dir():
        raise ModelError(f"{key}: tokenizer directory {str(path)!r} does not exist (hacrl never downloads)")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise ModelError(
            f"{key}: {str(path)!r} holds no tokenizer files (none of {', '.join(TOKENIZER_FILES)}); save the "
            "tokenizer into that directory (tokenizer.save_pretrained) or point the agent's `tokenizer` key at the "
            "directory that holds it"
        )
    refuse_model_code(path, key)
    try:
        if (path / "tokenizer.json").is_file():
            tokenizer = PreTrainedTokenizerFast.from_pretrained(path, local_files_only=True, trust_remote_code=False)
        else:
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    except Exception as e:  # noqa: BLE001 - transformers raises many types; the user needs the path and the cause
        raise ModelError(f"{key}: cannot load the tokenizer in {str(path)!r}: {type(e).__name__}: {e}") from e
    if tokenizer.eos_token_id is None:
        raise ModelError(f"{key}: tokenizer in {str(path)!r} has no eos_token; set it in tokenizer_config.json")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if not tokenizer.chat_template:
        raise ModelError(
            f"{key}: tokenizer in {str(path)!r} has no chat template; add chat_template.jinja to the folder"
        )
    return tokenizer


class SamplingCopy:
    """A copy of the agent's model that its sampler decodes with, where the trained module is not the one to decode
    with: a LoRA agent's base with the adapters' deltas merged in (`lora.merge_for_sampling`), a sharded agent's
    whole compute-dtype weights (`devices`). `follow` brings it up to the trained weights;
    `Agent.sync_sampling_weights` calls it when they changed since. `for_logprobs`: old log-probs are computed with
    it too (a sharded agent's ranks cannot run the sharded forward on shares of different sizes); a merged copy
    rounds W + BA differently from the adapters' forward, so a LoRA agent's old log-probs come from the trained
    module, which the training forward also is."""

    def __init__(self, model: torch.nn.Module, follow, *, for_logprobs: bool) -> None:
        self.model = model.eval().requires_grad_(False)
        self.follow = follow
        self.for_logprobs = for_logprobs


@torch.no_grad()
def merge_adapters(trained: torch.nn.Module, copy: torch.nn.Module) -> None:
    """Each LoRA-targeted layer of `copy` := the base layer's weight + its adapter's delta (peft's own)."""
    from peft.tuners.lora import LoraLayer

    targets = dict(copy.named_modules())
    for name, layer in trained.named_modules():
        if isinstance(layer, LoraLayer):
            base = layer.get_base_layer()
            delta = sum(layer.get_delta_weight(a) for a in layer.active_adapters)
            targets[name].weight.copy_((base.weight.float() + delta.float()).to(base.weight.dtype))


def _with_lora(model, lora, *, adapters_from: str | Path | None, seed: int):
    """`model` with LoRA adapters (peft): new ones (zero-initialised up-projections, so the model computes exactly
    what it did; the down-projections drawn from a stream seeded `seed`, so a run is repeatable whatever the
    process drew before), or the ones saved in `adapters_from` (a checkpoint's agent directory); only they train."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import PeftModel, get_peft_model

    if adapters_from is not None and (Path(adapters_from) / "adapter_config.json").is_file():
        return PeftModel.from_pretrained(model, str(adapters_from), is_trainable=True)
    targets = set(lora.target_modules)
    other = sorted({f"{name.rsplit('.', 1)[-1]} ({type(m).__name__})" for name, m in model.named_modules()
                    if name.rsplit(".", 1)[-1] in targets and not isinstance(m, torch.nn.Linear)})  # fmt: skip
    if other:
        from hacrl.errors import ModelError

        raise ModelError(
            f"LoRA target_modules={list(lora.target_modules)}: adapters go on linear layers only, and "
            f"{', '.join(other)} is not one (the samplers, the merged copy and `hacrl plan` assume linear adapters); "
            "remove it from target_modules, or train the whole agent (no lora) to train it"
        )
    config = PeftLoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        task_type="CAUSAL_LM",
    )
    try:
        device = next(model.parameters()).device  # on a GPU the adapters are drawn from its generator
        with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
            torch.manual_seed(seed)
            return get_peft_model(model, config)
    except ValueError as e:  # no module of that name in this model
        from hacrl.errors import ModelError

        raise ModelError(f"LoRA target_modules={list(lora.target_modules)}: {str(e).splitlines()[0]}") from None


def first_nonfinite(model: torch.nn.Module) -> str | None:
    """The name of the first parameter holding NaN or inf (None: all finite); one host sync for the whole model."""
    named = list(model.named_parameters())
    if not named:
        return None
    finite = torch.stack([p.detach().isfinite().all().to("cpu", non_blocking=True) for _, p in named])
    if bool(finite.all()):
        return None
    return named[int((~finite).nonzero()[0, 0])][0]


def _load_model(path: str | Path, cfg: AgentConfig, index: int, *, dtype: torch.dtype | None = None, device=None):
    """The model of a local directory (or GGUF file) in `dtype` (default: the agent's) on `device` (default: the
    agent's). transformers' per-file progress bars stay off in every worker process: hacrl says what it loads."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model_dir = require_model_dir(path, f"agents.{index}.model")
    try:
        model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=dtype or DTYPES[cfg.dtype], local_files_only=True, trust_remote_code=False
        )
    except Exception as e:  # noqa: BLE001 - a damaged or foreign directory: name it and the cause
        raise ModelError(
            f"agents.{index}.model: cannot load the model in {str(model_dir)!r}: {type(e).__name__}: "
            f"{str(e).splitlines()[0][:300] if str(e) else ''}"
        ) from e
    bad = first_nonfinite(model)
    if bad is not None:
        from hacrl.errors import NonFiniteError

        raise NonFiniteError(
            f"agents.{index}.model: the weights in {str(model_dir)!r} hold NaN or inf (first: {bad}); they cannot "
            "be trained or sampled from. Point the agent at an undamaged copy of the model."
        )
    return model.to(torch.device(device or cfg.device))


class Agent:
    """One participant of a run. `index` is its agent id everywhere in the core (source ids, capabilities)."""

    def __init__(
        self,
        index: int,
        cfg: AgentConfig,
        rollout: RolloutConfig,
        *,
        with_reference: bool = False,
        weights_from: str | Path | None = None,
        init_seed: int = 0,
        device: str | None = None,
        role: Role = "learner",
    ) -> None:
        """`weights_from`: a checkpoint's model directory to resume from (the reference stays `cfg.model`).
        `init_seed`: seeds what is initialised at random here (new LoRA adapters), apart from any other stream.
        `device`: where this process holds the agent (a rank's device in a worker group; None: `cfg.device`); a
        sharded agent (`cfg.devices`) needs its process group joined first (`hacrl.agent.distributed.init_group`).
        `role`: a learner, or a sampler of its own (`Precision.of_sampler`: nothing stepped, no reference)."""
        self.index = index
        self.name = cfg.name
        self.cfg = cfg
        self.settings = AgentSettings.resolve(cfg, rollout)
        """What it samples with (temperature, top-p, length limits, sampler, rows per call): resolved once here."""
        self.precision = Precision.resolve(cfg, f"agents.{index}", role)
        """How it computes and what AdamW steps (`hacrl.config.settings.Precision`): resolved once here."""
        self.device = torch.device(device or cfg.device)
        self.frozen = self.precision.trains == "nothing"
        """Nothing stepped: a frozen agent (`agents.<i>.frozen`), or a sampler of its own."""
        self.lora = cfg.lora if self.precision.mode == "lora" else None
        self._load_tokenizer(weights_from)
        self.peft_model = None
        self.optimizer: ParameterStep | MasterStep | None = None
        self._load_trained(weights_from, init_seed)
        self.ref_model = None
        if with_reference and not self.frozen:  # frozen initial weights for the KL term (only when kl_coef > 0)
            self.ref_model = _load_model(cfg.model, cfg, index, device=self.device).eval().requires_grad_(False)
        longest = max((len(t) for t in self.tokenizer.get_vocab()), default=1)
        self._prompt_chars = self.settings.max_prompt_tokens * (longest + 1)
        """Characters of a rendered prompt kept before tokenizing: no token is longer than the longest vocabulary
        entry, so a prompt that fits in `max_prompt_tokens` tokens is never cut by it."""
        self.eos_id, self.pad_id, self.stop_ids = self._special_ids()
        if cfg.gradient_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            # transformers also hooks the input embeddings to mark their output as requiring grad, which only the
            # reentrant checkpoint needs; the hook's `requires_grad_` breaks the static sampler's compiled decode
            # graph (torch 2.11 on a GPU: a graph break, then a guard failure on the dynamic row dimension)
            self.model.disable_input_require_grads()
        self.sampling_copy = self._sampling_copy()
        if self.precision.trains == "shards":  # after the copy: it is taken whole, then the model is sharded
            from hacrl.agent.distributed import shard
            from hacrl.agent.precision import ShardedStep

            shard(self.model, DTYPES[self.precision.compute], offload=self.precision.steps_on == "host")
            self.optimizer = ShardedStep(list(self.model.parameters()), cfg)
        from hacrl.agent.samplers import make_sampler

        self.sampler = make_sampler(self.settings.sampler, self, self.sampling_model)
        self._weights_moved = False

    def _special_ids(self) -> tuple[int, int, list[int]]:
        """Its EOS and pad ids, and every id that ends an answer (EOS, and the generation config's own)."""
        eos, pad = int(self.tokenizer.eos_token_id), int(self.tokenizer.pad_token_id)
        extra = self.model.generation_config.eos_token_id
        extra = [] if extra is None else [extra] if isinstance(extra, int) else list(extra)
        return eos, pad, sorted({eos, *map(int, extra)})

    def _load_tokenizer(self, weights_from: str | Path | None) -> None:
        cfg, index = self.cfg, self.index
        key = f"agents.{index}.tokenizer" if cfg.tokenizer else f"agents.{index}.model"
        source = cfg.tokenizer or cfg.model
        if weights_from is not None and any((Path(weights_from) / f).is_file() for f in TOKENIZER_FILES):
            # resuming: the tokenizer the run trained with, saved beside the weights (the original model
            # directory may be gone)
            source, key = weights_from, f"the checkpoint's copy of agent {cfg.name!r}"
        self.tokenizer = load_tokenizer(source, key=key)
        self._template_source = f"{key} ({source})"
        self._render([{"role": "user", "content": "What is 1 + 1?"}])  # a template that cannot render: named now

    def _load_trained(self, weights_from: str | Path | None, init_seed: int) -> None:
        """The trained module (`self.model`) and its optimizer, as `self.precision` says; a sharded agent's
        optimizer comes once its model is sharded."""
        cfg, index, precision = self.cfg, self.index, self.precision
        masters = None
        if precision.trains == "masters":  # float32 masters (a checkpoint holds them), the compute copy rounded
            from hacrl.agent.precision import make_masters

            self.model = _load_model(weights_from or cfg.model, cfg, index, dtype=torch.float32, device=HOST)
            offload = precision.steps_on == "host"
            params, masters = make_masters(self.model, DTYPES[precision.compute], self.device, offload=offload)
        else:  # a LoRA agent's checkpoint holds its adapters only: the base always comes from its model directory
            path = cfg.model if self.lora else (weights_from or cfg.model)
            self.model = _load_model(path, cfg, index, dtype=DTYPES[precision.load], device=self.device)
        if self.lora is not None:
            self.peft_model = _with_lora(self.model, self.lora, adapters_from=weights_from, seed=init_seed)
            self.model = self.peft_model.base_model.model  # the same HF model, the adapters injected in place
        if self.model.get_input_embeddings().num_embeddings < len(self.tokenizer):
            raise ModelError(
                f"agent {self.name!r}: the tokenizer has {len(self.tokenizer)} tokens but the model's "
                f"embedding only {self.model.get_input_embeddings().num_embeddings}"
            )
        self._adapters = [n for n, p in self.model.named_parameters() if p.requires_grad] if self.lora else []
        """A LoRA agent's adapters, by parameter name (what its learner hands its sampler)."""
        if self.frozen:  # a peer that shares without learning, or a sampler: no gradients, no optimizer state
            # a sampler's module is in its learner's mode, so that its log-probs are the learner's
            self.model.train(not self.cfg.frozen).requires_grad_(False)
            return
        self.model.train()
        if masters is not None:
            self.optimizer = MasterStep(params, masters, cfg, offload=precision.steps_on == "host")
        elif precision.trains in ("parameters", "adapters"):
            self.optimizer = ParameterStep(self.trainable_parameters(), cfg)
            if precision.mode == "pure":
                _warn_if_updates_round_away(self, index)

    def _sampling_copy(self) -> SamplingCopy | None:
        """The copy the sampler decodes with, where `self.precision` asks for one (up to date when returned)."""
        kind = self.precision.sampling_copy
        if kind == "merged":
            base = _load_model(self.cfg.model, self.cfg, self.index, device=self.device)
            merged = SamplingCopy(base, lambda: merge_adapters(self.model, base), for_logprobs=False)
            merged.follow()
            return merged
        if kind == "gathered":  # the float32 model, whole, in the compute dtype (taken before it is sharded)
            import copy

            from hacrl.agent.distributed import gather_into

            whole = copy.deepcopy(self.model)
            compute = DTYPES[self.precision.compute]
            for p in whole.parameters():
                p.data = p.data.to(compute)
            whole.config.dtype = compute  # what the saved model directory says (export's default dtype)
            return SamplingCopy(whole, lambda: gather_into(self.model, whole, self.device), for_logprobs=True)
        return None

    @property
    def sampling_model(self) -> torch.nn.Module:
        """The module the sampler decodes with: the sampling copy, or the trained module itself."""
        return self.sampling_copy.model if self.sampling_copy is not None else self.model

    @property
    def logprob_model(self) -> torch.nn.Module:
        """The module that computes log-probs without gradients (old log-probs, `top_k` relevance): the trained
        module, or a sampling copy that computes what it computes (`SamplingCopy.for_logprobs`)."""
        copy = self.sampling_copy
        return copy.model if copy is not None and copy.for_logprobs else self.model

    def weights_changed(self) -> None:
        """After an optimizer step: what samples from these weights follows them at the next
        `sync_sampling_weights` (not per step: an update may take several)."""
        self._weights_moved = True

    def sync_sampling_weights(self) -> None:
        """Before sampling: when the weights changed since the last call, the sampling copy follows them (a merge,
        or for a sharded agent a gather: a collective, so every rank calls this at the same point) and the sampler
        is told (`Sampler.refresh`)."""
        if not self._weights_moved:
            return
        if self.sampling_copy is not None:
            self.sampling_copy.follow()
        self.sampler.refresh()
        self._weights_moved = False

    def render_prompt(self, messages: list[dict[str, str]]) -> tuple[list[int], bool]:
        """Token ids of the prompt in this agent's chat template; True when it was cut from the left."""
        text = self._render(messages)
        if len(text) > self._prompt_chars:  # a 100 MB row is cut before tokenizing, not after (memory, time)
            text = text[-self._prompt_chars :]
        ids = self.tokenizer(text, add_special_tokens=False).input_ids
        limit = self.settings.max_prompt_tokens
        if len(ids) > limit:
            return ids[-limit:], True
        return ids, False

    def _render(self, messages: list[dict[str, str]]) -> str:
        """`messages` in the chat template (Jinja, sandboxed by transformers); a template that fails to render (a
        syntax error, a sandbox violation, `raise_exception` on these roles) is a ModelError naming the tokenizer's
        directory, not a traceback from inside Jinja."""
        try:
            return self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False, **self.cfg.chat_template_kwargs
            )
        except Exception as e:  # noqa: BLE001 - jinja2's TemplateError family, or whatever the template raises
            roles = [m.get("role") for m in messages]
            raise ModelError(
                f"agents.{self.index}: the chat template of {self._template_source} cannot render a prompt with roles "
                f"{roles} ({type(e).__name__}: {first_line(e, 200)}); fix chat_template.jinja (or the tokenizer's "
                f"chat_template), or agents.{self.index}.chat_template_kwargs"
            ) from None

    def encode_response(self, text: str, finished: bool) -> tuple[list[int], bool]:
        """Another agent's response in this agent's tokens (spec 2, step 5b): plain text, EOS only when the source
        finished, cut from the right to `max_new_tokens`; True when it was cut."""
        ids = self.tokenizer(text, add_special_tokens=False, split_special_tokens=True).input_ids
        if finished:
            ids = [*ids, self.eos_id]
        limit = self.settings.max_new_tokens
        if len(ids) > limit:
            return ids[:limit], True
        return ids, False

    def decode(self, response_ids: list[int]) -> str:
        """Response text for scoring and sharing: special tokens (EOS, stray pads) are dropped."""
        return self.tokenizer.decode(response_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def handed_over(self) -> dict[str, torch.nn.Parameter]:
        """What a learner hands its sampler of its own after each update: a LoRA agent's adapters (the sampler
        holds the same base; its merged copy follows them), otherwise every weight of the module it samples with."""
        if self.lora is not None:
            params = dict(self.model.named_parameters())
            return {n: params[n] for n in self._adapters}
        return dict(self.sampling_model.named_parameters())

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def trained_state_dict(self) -> dict[str, torch.Tensor] | None:
        """What a checkpoint saves as this agent's weights when they are not the model's own: the float32 masters,
        under the model's parameter names (None: save the model as it is)."""
        if not isinstance(self.optimizer, MasterStep):
            return None
        master_of = {id(p): m for p, m in zip(self.optimizer.params, self.optimizer.masters, strict=True)}
        state = self.model.state_dict()
        for name, p in self.model.named_parameters(remove_duplicate=False):
            if id(p) in master_of:
                state[name] = master_of[id(p)].detach().to(HOST)
        return state


def _warn_if_updates_round_away(agent: Agent, index: int) -> None:
    """Pure low-precision training (`master_weights: none`): say so when lr is below half an ulp of a typical
    weight, where AdamW's steps (about lr each) round away."""
    from hacrl.agent.precision import half_ulp, typical_weight
    from hacrl.errors import warn

    dtype = DTYPES[agent.cfg.dtype]
    weight = typical_weight(agent.trainable_parameters())
    resolution = half_ulp(weight, dtype)
    if agent.cfg.lr < resolution:
        warn(
            f"agents.{index} ({agent.name!r}) trains its {agent.cfg.dtype} weights directly "
            f"(master_weights=none) at lr {agent.cfg.lr:g}, below half a {agent.cfg.dtype} ulp at its typical "
            f"weight (median |w| {weight:.3g}: {resolution:.2g}): most updates will round away and the agent will "
            f"barely train. Use agents.{index}.master_weights=float32 (the default), or a larger lr"
        )
