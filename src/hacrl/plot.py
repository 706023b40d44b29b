"""`hacrl plot RUN_DIR`: training reward and eval accuracy per agent, one PNG."""

from __future__ import annotations

from pathlib import Path


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    metrics_file = run_dir / "metrics.jsonl"
    if not metrics_file.is_file():
        from hacrl.errors import RunDirError

        raise RunDirError(f"{metrics_file} does not exist: is {str(run_dir)!r} a hacrl run directory?")
    from hacrl.metrics import agent_values, agents_in, eval_values
    from hacrl.rundir import read_metrics

    records = [record for _, record in read_metrics(metrics_file, notice=lambda _: None)]
    reward = {name: agent_values(records, name, "reward_mean") for name in agents_in(records, "agent")}
    accuracy = {name: eval_values(records, name, "pass@1") for name in agents_in(records, "eval")}
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
    right.set(title="eval accuracy, greedy pass@1", xlabel="step", ylabel="%")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend()
    fig.tight_layout()
    out_path = Path(out) if out else run_dir / "curves.png"
    fig.savefig(out_path, dpi=120)
    plt.close(fig)
    return out_path
