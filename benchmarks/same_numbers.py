"""Numbers unchanged by a refactor (issue 70, part 7): the same runs at a base commit and at the working tree, every
logged value (but times) and every checkpoint file compared.

    python benchmarks/same_numbers.py                 # against e50bccb (before the house issue)
    python benchmarks/same_numbers.py --base HEAD~3 --cases hacpo-lag1-samplers

The base is checked out into a temporary git worktree and run with the same interpreter, its `src` first on
PYTHONPATH (so its scoring processes, rank processes and Ray actors import it too). Each case is a 3-step run of the
tests' two tiny agents (Llama on characters, Qwen2 on a BPE; built once, seeded; bare questions, `data.system_prompt:
null`, as the tests ask them, so a base before the prompt's default changed in 495bd38 asks the same), checkpointed
every step:

    hacpo, gspo                 lag 0, local backend
    hacpo-lag1-samplers         lag 1, each agent with a sampler process of its own
    hacpo-group                 qwen a worker group of two gloo ranks (FSDP2)
    hacpo-ray, ...-ray          the same on Ray
    control, control-replay     `hacrl control` on configs/control.yaml (two policies on mpe2's simple_v3), 6 steps
                                with an evaluation every 3; the second with a replay buffer of 2 steps

Compared: metrics.jsonl record by record without the keys that measure time; every file of every checkpoint byte
for byte, except state.json (it holds the others' digests, so a file that differs shows there first) where the
step, the capability history and the data position are compared instead. A file whose bytes differ is then read:
a torch file's tensors and numbers, a sharded optimizer's tensor records (its `.metadata` holds the run's own
storage id), a config without the run's directory (keys added since the base are listed; a setting whose saved
value differs, such as a default renamed since, is listed, not counted as a number); the verdict asks for equal
records and equal values. Prints a table and writes benchmarks/results/same_numbers.json and .md (`--out`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

CASES = {
    "hacpo": {},
    "gspo": {"algorithm": {"name": "gspo"}},
    "hacpo-lag1-samplers": {"trainer": {"lag": 1}, "samplers": True},
    "hacpo-group": {"group": True},
    "hacpo-ray": {"runtime": {"backend": "ray", "torch_threads": 1}},
    "hacpo-lag1-samplers-ray": {"trainer": {"lag": 1}, "samplers": True, "runtime": {"backend": "ray",
                                                                                   "torch_threads": 1}},
    "control": {"command": "control"},
    "control-replay": {"command": "control", "sharing": {"replay": {"steps": 2, "groups": 4}}},
}  # fmt: skip


def build_agents(work: Path) -> Path:
    sys.path.insert(0, str(ROOT))
    from tests.conftest import ALPHABET, sum_corpus

    from hacrl.tools.testbed.models import bpe_tokenizer, char_tokenizer, save_agent, tiny_model

    agents = work / "agents"
    char, bpe = char_tokenizer(ALPHABET), bpe_tokenizer(sum_corpus(), 80)
    save_agent(tiny_model("llama", char, hidden=32, layers=2, heads=2, kv_heads=1, seed=1), char, agents / "llama")
    save_agent(tiny_model("qwen2", bpe, hidden=48, layers=2, heads=4, kv_heads=2, seed=2), bpe, agents / "qwen")
    return agents


def config(case: str, agents: Path, run: Path) -> dict:
    sys.path.insert(0, str(ROOT))
    from tests.conftest import TASK

    spec = CASES[case]
    if spec.get("command") == "control":
        import yaml

        base = yaml.safe_load((ROOT / "configs" / "control.yaml").read_text())
        base["trainer"].update({"steps": 6, "initial_states_per_step": 4, "output_dir": str(run)})
        base["eval"] = {"every": 3, "initial_states": 16}
        base["checkpoint"] = {"every": 2, "keep_last": 3}
        base["logging"] = {"console": False, "tensorboard": False}
        base["sharing"] = spec.get("sharing", {})
        return base
    llama = {"name": "llama", "model": str(agents / "llama"), "lr": 3e-3}
    qwen = {"name": "qwen", "model": str(agents / "qwen"), "lr": 3e-3}
    if spec.get("samplers"):
        llama["sampler_devices"] = qwen["sampler_devices"] = ["cpu"]
    if spec.get("group"):
        qwen["devices"] = ["cpu", "cpu"]
    return {
        "agents": [llama, qwen],
        "algorithm": {"name": "hacpo", **spec.get("algorithm", {})},
        "rollout": {"group_size": 4, "max_new_tokens": 6, "max_prompt_tokens": 96},
        "data": {**TASK, "train_size": 64, "eval_size": 8, "heldout_size": 8, "system_prompt": None},
        "scoring": {"function": "tests.reward_fixtures:digits"},
        "trainer": {"steps": 3, "prompts_per_step": 2, "mini_batch_size": 4, "micro_batch_size": 2,
                    "output_dir": str(run), **spec.get("trainer", {})},
        "eval": {"at_start": False, "every": 0},
        "logging": {"console": False, "tensorboard": False},
        "checkpoint": {"every": 1, "keep_last": 3},
        "runtime": {"torch_threads": 1, **spec.get("runtime", {})},
    }  # fmt: skip


def run(case: str, source: Path, agents: Path, out: Path) -> tuple[int, str]:
    """`hacrl train` of `case` with `source`'s hacrl (its `src` first on PYTHONPATH); (exit status, stderr tail)."""
    import yaml

    path = out.with_suffix(".yaml")
    path.write_text(yaml.safe_dump(config(case, agents, out)))
    env = {**os.environ, "PYTHONPATH": f"{source / 'src'}:{ROOT}", "OMP_NUM_THREADS": "1"}
    command = CASES[case].get("command", "train")
    code = f"import sys; sys.path.insert(0, {str(source / 'src')!r}); from hacrl.tools.cli import main; " \
           f"sys.exit(main([{command!r}, {str(path)!r}]))"  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    return done.returncode, done.stderr[-2000:]


def records(run_dir: Path) -> list[dict]:
    sys.path.insert(0, str(ROOT))
    from tests.conftest import without_timings

    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [without_timings(json.loads(line)) for line in lines if line.strip()]


def files(run_dir: Path) -> dict[str, str]:
    """Every checkpoint file (but state.json) -> its SHA-256; state.json's run state as one entry."""
    out = {}
    for path in sorted((run_dir / "checkpoints").rglob("*")):
        if not path.is_file():
            continue
        name = str(path.relative_to(run_dir))
        if path.name == "state.json":
            state = json.loads(path.read_text())
            out[name] = json.dumps({k: state.get(k) for k in ("step", "capability", "data", "agents")}, sort_keys=True)
        else:
            out[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def same_values(a: Path, b: Path) -> str | None:
    """Why two files whose bytes differ hold the same values (None: they do not, or it cannot tell): a torch file's
    tensors and numbers (`weights_only`), a sharded optimizer's `.metadata` tensor records (its storage id and path
    are the run's own), a config without the run's directory and with only the keys both sides know."""
    import torch

    if a.suffix == ".pt":
        x, y = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
        if a.name == "pending.pt":  # each batch's sampling times are the run's own (`hacrl.inflight`)
            for data in (x, y):
                for batch in data["batches"]:
                    for agent in batch["agents"]:
                        agent.pop("times", None)
            return "same values but the sampling times" if _equal(x, y) else None
        return "same values, other bytes" if _equal(x, y) else None
    if a.name == ".metadata":
        sys.path.insert(0, str(ROOT / "src"))
        from hacrl.checkpoint import read_sharded_metadata

        x, y = read_sharded_metadata(a.parent), read_sharded_metadata(b.parent)
        return "same tensor records (the storage id is the run's)" if _equal(
            x.state_dict_metadata, y.state_dict_metadata) else None  # fmt: skip
    if a.name == "config.yaml":
        import yaml

        x, y = yaml.safe_load(a.read_text()), yaml.safe_load(b.read_text())
        for c in (x, y):
            c["trainer"].pop("output_dir", None)
        added = sorted(_keys(y) - _keys(x))
        if _common(x, y):
            return "same values" + (f"; keys added since: {', '.join(added)}" if added else "")
        DIFFERING_KEYS.update(_differing(x, y))
    return None


DIFFERING_KEYS: set[str] = set()
"""The config keys both sides know whose values differ (reported beside the verdict)."""


def _differing(x, y, prefix: str = "") -> set[str]:
    if isinstance(x, dict) and isinstance(y, dict):
        return {k for key in x.keys() & y.keys() for k in _differing(x[key], y[key], f"{prefix}.{key}".strip("."))}
    return set() if x == y else {f"{prefix}: {x!r} -> {y!r}"}


def _equal(x, y) -> bool:
    import torch

    if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
        return isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.dtype == y.dtype and torch.equal(x, y)
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(_equal(x[k], y[k]) for k in x)
    if isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
        return len(x) == len(y) and all(_equal(a, b) for a, b in zip(x, y, strict=True))
    if hasattr(x, "__dict__") and type(x) is type(y):
        return _equal(vars(x), vars(y))
    if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
        return True  # a reward not yet known is NaN on both sides
    return x == y


def _keys(tree, prefix="") -> set[str]:
    if not isinstance(tree, dict):
        return {prefix}
    return {k for key, value in tree.items() for k in _keys(value, f"{prefix}.{key}" if prefix else key)}


def _common(x, y) -> bool:
    """Every key both trees have holds the same value."""
    if isinstance(x, dict) and isinstance(y, dict):
        return all(_common(x[k], y[k]) for k in x.keys() & y.keys())
    return x == y


def compare(base: Path, head: Path) -> dict:
    a, b = records(base), records(head)
    differing_records = [i + 1 for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y]
    fa, fb = files(base), files(head)
    differing = sorted(k for k in set(fa) | set(fb) if fa.get(k) != fb.get(k))
    explained, unexplained = {}, []
    DIFFERING_KEYS.clear()
    for name in differing:
        why = same_values(base / name, head / name) if name in fa and name in fb else None
        if why is None and name.endswith("config.yaml") and name in fa and name in fb:
            why = "a setting's value differs (listed below)"  # not a number: reported, not counted as one
        if why is None:
            unexplained.append(name)
        else:
            explained.setdefault(why, []).append(name)
    return {"records": len(b), "records_equal": a == b, "differing_steps": differing_records, "files": len(fb),
            "files_equal": not differing, "values_equal": not unexplained, "differing_files": unexplained[:10],
            "differing_config_keys": sorted(DIFFERING_KEYS),
            "same_values_other_bytes": {why: len(names) for why, names in explained.items()}}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="e50bccb")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--out", type=Path, default=HERE / "results" / "same_numbers.json")
    args = parser.parse_args(argv)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "src"], cwd=ROOT, capture_output=True, text=True)
    label = head.stdout.strip() + (" + changes" if dirty.stdout.strip() else "")
    results = {}
    with tempfile.TemporaryDirectory(prefix="hacrl-same-") as tmp:
        work = Path(tmp)
        base = work / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(base), args.base], cwd=ROOT, check=True,
                       capture_output=True)  # fmt: skip
        try:
            agents = build_agents(work)
            for case in args.cases:
                outcome = {}
                for side, source in (("base", base), ("head", ROOT)):
                    code, err = run(case, source, agents, work / f"{case}-{side}")
                    if code:
                        outcome[f"{side}_error"] = err
                results[case] = outcome if outcome else compare(work / f"{case}-base", work / f"{case}-head")
                print(f"{case}: {json.dumps(results[case])}", flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, capture_output=True)
    same = all(r.get("records_equal") and r.get("values_equal") for r in results.values())
    report = {"base": args.base, "head": label, "cases": results, "all_equal": same}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    lines = [f"# Numbers unchanged: {args.base} -> {label}", "",
             "| case | records equal | checkpoint files: bytes equal | values equal | bytes differ: why |",
             "|---|---|---|---|---|"]  # fmt: skip
    for case, r in results.items():
        why = "; ".join(f"{n}: {w}" for w, n in r.get("same_values_other_bytes", {}).items()) or "-"
        lines.append(f"| {case} | {r.get('records_equal', 'error')} ({r.get('records', '-')}) | "
                     f"{r.get('files_equal', 'error')} ({r.get('files', '-')}) | {r.get('values_equal', 'error')} | "
                     f"{why} |")  # fmt: skip
    verdict = "every logged number and checkpoint value equal" if same else "DIFFERENT"
    lines += ["", f"{args.base} -> {label}: {verdict}."]
    keys = sorted({k for r in results.values() for k in r.get("differing_config_keys", [])})
    if keys:
        lines += ["", "Settings the saved config.yaml holds with another value (a default renamed or changed since "
                  "the base; the numbers above say whether it changed anything): " + "; ".join(keys) + "."]  # fmt: skip
    lines += ["",
              f"Reproduce: `python benchmarks/same_numbers.py --base {args.base}`", ""]  # fmt: skip
    text = "\n".join(lines)
    args.out.with_suffix(".md").write_text(text)
    print(text)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
