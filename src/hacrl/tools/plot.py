"""`hacrl plot RUN_DIR`: training reward and eval accuracy per agent, one PNG; with `eval.benchmarks`, a second one
(`benchmarks.png`) with each benchmark's greedy accuracy over the steps."""

from __future__ import annotations

from pathlib import Path


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> list[Path]:
    """Write the curves of `run_dir` to `out` (a .png file, or a directory for `curves.png`; default: the run
    directory) and, when the run evaluated benchmarks, `benchmarks.png` beside it; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    metrics_file = run_dir / "metrics.jsonl"
    if not metrics_file.is_file():
        from hacrl.errors import RunDirError

        raise RunDirError(f"{metrics_file} does not exist: is {str(run_dir)!r} a hacrl run directory?")
    from hacrl.driver.metrics import agent_values, agents_in, eval_values
    from hacrl.driver.rundir import read_metrics

    records = [record for _, record in read_metrics(metrics_file, notice=lambda _: None)]
    reward = {name: agent_values(records, name, "reward_mean") for name in agents_in(records, "agent")}
    accuracy = {name: eval_values(records, name, "pass@1") for name in agents_in(records, "eval")}
    measure = "accuracy, greedy pass@1"
    if not any(accuracy.values()):  # a control run (`hacrl control`): the share of greedy episodes that succeed
        accuracy = {name: eval_values(records, name, "success") for name in agents_in(records, "eval")}
        measure = "success, greedy episodes"
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for name, points in sorted(reward.items()):
        if not points:
            continue
        steps, values = zip(*sorted(dict(points).items()), strict=True)
        left.plot(steps, values, label=name)
    for name, points in sorted(accuracy.items()):
        if not points:
            continue
        steps, values = zip(*sorted(dict(points).items()), strict=True)
        right.plot(steps, [100 * v for v in values], marker="o", label=name)
    left.set(title="training reward (mean over own rollouts)", xlabel="step", ylabel="reward")
    right.set(title=f"eval {measure}", xlabel="step", ylabel="%")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend()
    fig.tight_layout()
    out_path = _png(out, run_dir)
    fig.savefig(out_path, dpi=120)
    plt.close(fig)
    written = [out_path]
    if _plot_benchmarks(records, out_path.with_name("benchmarks.png"), plt):
        written.append(out_path.with_name("benchmarks.png"))
    return written


def _png(out: str | Path | None, run_dir: Path) -> Path:
    """Where the curves go: `out` as a .png file, `out/curves.png` for a directory, the run directory by default
    (matplotlib would add `.png` to a name without it, and the path printed would not be the file written)."""
    from hacrl.errors import RunDirError

    if out is None:
        return run_dir / "curves.png"
    path = Path(out)
    if path.is_dir():
        return path / "curves.png"
    if path.suffix.lower() != ".png":
        raise RunDirError(f"hacrl plot --out {str(out)!r}: give a .png file or an existing directory")
    if not path.parent.is_dir():
        raise RunDirError(f"hacrl plot --out {str(out)!r}: the directory {str(path.parent)!r} does not exist")
    return path


def _plot_benchmarks(records: list[dict], out: Path, plt) -> bool:
    """One panel per benchmark (`eval/<agent>/<benchmark>/pass@1`), a line per agent; nothing without benchmarks
    (False)."""
    from hacrl.driver.metrics import parse

    curves: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for record in records:
        for key, value in record.items():
            parsed = parse(key)
            if parsed and parsed[0] == "eval" and parsed[2].name == "{benchmark}/pass@1":
                benchmark = key.split("/")[2]
                curves.setdefault(benchmark, {}).setdefault(parsed[1], []).append((record["step"], value))
    if not curves:
        return False
    fig, axes = plt.subplots(1, len(curves), figsize=(4 * len(curves), 3.5), squeeze=False)
    for ax, (benchmark, agents) in zip(axes[0], sorted(curves.items()), strict=True):
        for agent, points in sorted(agents.items()):
            steps, values = zip(*sorted(dict(points).items()), strict=True)
            ax.plot(steps, [100 * v for v in values], marker="o", label=agent)
        ax.set(title=f"{benchmark}, greedy pass@1", xlabel="step", ylabel="%")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return True
