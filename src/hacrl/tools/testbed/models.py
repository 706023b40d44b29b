"""Tiny agents built from nothing but code: tokenizers trained locally and small causal LMs from configs.

Used by the test suite and the built-in demo; nothing is downloaded. Every tokenizer gets `<pad>`, `<eos>`,
`<unk>` and a minimal chat template; every model is an ordinary Hugging Face model that saves and loads with
`save_pretrained` / `AutoModelForCausalLM.from_pretrained`.
"""

from __future__ import annotations

from pathlib import Path

SPECIALS = ["<pad>", "<eos>", "<unk>"]

CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}S:{{ m['content'] }}\n"
    "{% elif m['role'] == 'user' %}Q:{{ m['content'] }}\n"
    "{% else %}A:{{ m['content'] }}<eos>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}A:{% endif %}"
)
"""`Q:<question>\\nA:` for a single user turn: short, so tiny models spend their capacity on the answer."""


def _wrap(tokenizer_object, chat_template: str):
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer_object, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>", padding_side="left"
    )
    tok.chat_template = chat_template
    return tok


def char_tokenizer(alphabet: str, *, chat_template: str = CHAT_TEMPLATE):
    """One token per character of `alphabet` (plus the specials); other characters become `<unk>`."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for ch in sorted(set(alphabet)):
        vocab.setdefault(ch, len(vocab))
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tk.add_special_tokens(SPECIALS)
    return _wrap(tk, chat_template)


def bpe_tokenizer(corpus: list[str], vocab_size: int, *, chat_template: str = CHAT_TEMPLATE, digits: bool = False):
    """A BPE tokenizer trained on `corpus` with `tokenizers` (merges may span digits, so '12' can be one token;
    `digits`: every digit a token of its own, as Llama 3's and Qwen's tokenizers split numbers)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE(unk_token="<unk>"))
    if digits:
        tk.pre_tokenizer = pre_tokenizers.Digits(individual_digits=True)
    tk.decoder = decoders.Fuse()
    alphabet = sorted({ch for text in corpus for ch in text})
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=alphabet, show_progress=False
    )
    tk.train_from_iterator(corpus, trainer=trainer)
    return _wrap(tk, chat_template)


def tiny_model(
    family: str,
    tokenizer,
    *,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    ffn: int | None = None,
    seed: int = 0,
    max_positions: int = 512,
    init_std: float = 0.02,
):
    """A randomly initialised causal LM of `family` ('llama', 'qwen2', 'qwen3': the last with per-head query and
    key norms) sized for `tokenizer`. A larger `init_std` than the usual 0.02 gives a model whose outputs depend
    strongly on its input (tests of samplers want that)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

    classes = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config}
    if family not in classes:
        raise ValueError(f"unknown model family {family!r}; known: {sorted(classes)}")
    config = classes[family](
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=ffn or 4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        initializer_range=init_std,
        **({"head_dim": hidden // heads} if family == "qwen3" else {}),
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config)


def save_agent(model, tokenizer, directory: str | Path) -> Path:
    """Write a Hugging Face model directory (safetensors, config, tokenizer, chat template)."""
    directory = Path(directory)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    return directory
