"""`hacrl plot RUN_DIR`: training reward and eval accuracy per agent, one PNG; with `eval.benchmarks`, each
benchmark's greedy accuracy over the steps: in a second PNG (`benchmarks.png`) beside `curves.png` in the run
directory or the directory `--out` names, or as a second row of the one file `--out` names (hacrl never writes a
file the user did not name)."""

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
    benchmarks = _benchmark_curves(records)
    out_path = _png(out, run_dir)
    one_file = out is not None and not Path(out).is_dir()  # a file the user named: everything goes into it
    rows = 2 if benchmarks and one_file else 1
    width = max(2, len(benchmarks)) if rows == 2 else 2
    fig, axes = plt.subplots(rows, width, figsize=(5.5 * width, 4 * rows), squeeze=False)
    _draw_curves(axes[0], reward, accuracy, measure)
    if rows == 2:
        _draw_benchmarks(benchmarks, axes[1])
    fig.tight_layout()
    fig.savefig(out_path, dpi=120)
    plt.close(fig)
    written = [out_path]
    if benchmarks and rows == 1:  # beside curves.png, in the run directory or the directory --out names
        fig, axes = plt.subplots(1, len(benchmarks), figsize=(4 * len(benchmarks), 3.5), squeeze=False)
        _draw_benchmarks(benchmarks, axes[0])
        fig.tight_layout()
        fig.savefig(out_path.with_name("benchmarks.png"), dpi=120)
        plt.close(fig)
        written.append(out_path.with_name("benchmarks.png"))
    return written


def _draw_curves(axes, reward, accuracy, measure: str) -> None:
    """The training reward (left) and the evaluation accuracy (right) per agent; panels after them blanked."""
    left, right = axes[0], axes[1]
    for ax in axes[2:]:
        ax.axis("off")
    for name, points in sorted(reward.items()):
        if points:
            steps, values = zip(*sorted(dict(points).items()), strict=True)
            left.plot(steps, values, label=name)
    for name, points in sorted(accuracy.items()):
        if points:
            steps, values = zip(*sorted(dict(points).items()), strict=True)
            right.plot(steps, [100 * v for v in values], marker="o", label=name)
    left.set(title="training reward (mean over own rollouts)", xlabel="step", ylabel="reward")
    right.set(title=f"eval {measure}", xlabel="step", ylabel="%")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend()


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


def _benchmark_curves(records: list[dict]) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """{benchmark: {agent: [(step, greedy accuracy)]}} from the records' `eval/<agent>/<benchmark>/pass@1`."""
    from hacrl.driver.metrics import parse

    curves: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for record in records:
        for key, value in record.items():
            parsed = parse(key)
            if parsed and parsed[0] == "eval" and parsed[2].name == "{benchmark}/pass@1":
                benchmark = key.split("/")[2]
                curves.setdefault(benchmark, {}).setdefault(parsed[1], []).append((record["step"], value))
    return curves


def _draw_benchmarks(curves, axes) -> None:
    """One panel per benchmark, a line per agent; panels beyond the benchmarks are blanked."""
    for ax, (benchmark, agents) in zip(axes, sorted(curves.items()), strict=False):
        for agent, points in sorted(agents.items()):
            steps, values = zip(*sorted(dict(points).items()), strict=True)
            ax.plot(steps, [100 * v for v in values], marker="o", label=agent)
        ax.set(title=f"{benchmark}, greedy pass@1", xlabel="step", ylabel="%")
        ax.grid(alpha=0.3)
        ax.legend()
    for ax in axes[len(curves) :]:
        ax.axis("off")
