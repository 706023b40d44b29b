"""`hacrl plan CONFIG --measure`: time a short run of the real config on this machine and propose a rollout budget
per agent (`agents.<i>.group_size`) under which the agents' phases end together.

The time model (per step, B = `trainer.prompts_per_step`, G_j = agent j's group size):

    sampling of agent j      S_j = a_j * B * G_j           a_j: its measured seconds per answer
    update of learner k      U_k = b_k * B * P_k           b_k: its measured seconds per trained row; P_k the answers
                                                           per prompt in its pool: sum_j G_j when the algorithm shares
                                                           (G_k + at most `sharing.budget_per_prompt` of the others'
                                                           with a budget; with groups: `foreign_per_prompt`), G_k
                                                           when it does not, 0 for a frozen agent; a policy that
                                                           keeps fewer rows makes this an upper bound
    scoring                  C = c * B * sum_j G_j         c: seconds per answer
    a lockstep step          T = max_j S_j + C + max_k U_k (agents concurrent: Ray, or a device each)

An agent that samples faster than the slowest one waits max S - S_j each step; more answers fill that wait. But in
a sharing run every learner trains on every answer, so each answer added also lengthens the slowest update: the
proposal adds answers (whole mini-batches) to the agent with the most sampling wait while its sampling still ends
within the slowest agent's and the step stays within `slack` of today's, and reports the predicted idle fraction,
answers per second and step time before and after. Without sharing (gspo, grpo), or with a sharing budget
(`sharing.budget_per_prompt`) that bounds what the other learners take of them, a fast agent's extra answers only
lengthen its own, faster update, so both phases can end together; under `sharing.policy: all` without one, the
proposal also tries a budget and proposes it beside the group sizes when that pays (`hacrl.driver.pace.propose`).

The measurements are steps 2-4 of a 4-step run of the config as given (backend, threads, devices), in a temporary
directory (the first step pays one-time costs); it writes nothing else. The proposal is made from each agent's
median cost over those steps, and the output says how much the costs, the proposal and its prediction vary from step
to step; `--runs N` measures N times, each a run of its own, pools their steps and says what each run alone would
have proposed (a second run's costs differ more than its steps do: on the issue's pair, 32 and 40 for the small
agent). The model itself (`Costs`, `predict`, `propose`, `advise`) lives in `hacrl.driver.pace`: the end-of-run
advice of every lockstep run reads the same one.
"""

from __future__ import annotations

from dataclasses import replace

from hacrl.config import TrainConfig
from hacrl.driver.pace import (  # the one time model (the end-of-run advice reads it too)
    Advice,
    Costs,
    Prediction,
    advise,
    predict,
    propose,
    run_shape,
    sharing_terms,
    step_costs,
)

__all__ = ["Advice", "Costs", "Prediction", "advise", "measure", "predict", "propose", "render", "sharing_terms"]

MEASURED_STEPS = 3
"""Steps `measure` reads (after a first one that pays one-time costs): the advice says how much they vary."""


def measure(config: TrainConfig, steps: int = MEASURED_STEPS) -> list[Costs]:
    """Run `steps` + 1 steps of `config` in a temporary directory and read each agent's costs from every step but
    the first (which pays one-time costs): one `Costs` per measured step."""
    import contextlib
    import io
    import tempfile

    from hacrl.driver.trainer import Trainer

    with tempfile.TemporaryDirectory(prefix="hacrl-measure-") as tmp:
        run = _measuring_copy(config, tmp, steps + 1)
        trainer = Trainer(run)
        concurrent = trainer.schedule.concurrent
        with contextlib.redirect_stdout(io.StringIO()):  # its step lines and summary are not this command's output
            records = trainer.train()[1:]
    shape = run_shape(config, concurrent=concurrent)
    return [step_costs(record, shape) for record in records]


def _measuring_copy(config: TrainConfig, directory: str, steps: int) -> TrainConfig:
    """`config` for `steps` steps in `directory`: evaluation on one prompt, no checkpoint before the end, no
    trackers."""
    import copy

    run = copy.deepcopy(config)
    run.trainer = replace(run.trainer, steps=steps, output_dir=directory)
    # the last step always evaluates: on one prompt
    run.eval = replace(run.eval, every=0, at_start=False, max_prompts=1, num_samples=0, benchmarks=[],
                       save_completions=False)  # fmt: skip
    run.checkpoint = replace(run.checkpoint, every=0)
    run.logging = replace(run.logging, console=False, tensorboard=False, wandb=None, trackio=None)
    return run


def render(advice: Advice) -> str:
    """The measured costs, today's prediction and the proposal, how much they vary, and the settings to type."""
    costs, now, proposed = advice.costs, advice.now, advice.proposed
    runs = max(1, len(advice.between_runs))
    last = advice.steps // runs + 1
    each = f" of each of {runs} runs" if runs > 1 else ""
    lines = [f"measured (steps 2-{last} of {last}{each} on this machine, medians; B = {costs.prompts} prompts per "
             "step):", ""]  # fmt: skip
    lines.append(f"{'agent':<16}{'s/answer':>10}{'varies':>8}{'s/row trained':>15}{'G now':>7}{'G proposed':>12}"
                 f"{'by step':>9}{'sampling s':>12}{'update s':>10}")  # fmt: skip
    for j, name in enumerate(costs.names):
        lo, hi = advice.group_sizes[j]
        lines.append(f"{name:<16}{costs.per_answer[j]:>10.4f}{100 * advice.per_answer_spread[j]:>7.0f}%"
                     f"{costs.per_row[j]:>15.4f}{now.group_sizes[j]:>7}{proposed.group_sizes[j]:>12}"
                     f"{f'{lo}-{hi}' if lo != hi else str(lo):>9}{now.sampling[j]:>6.2f}->{proposed.sampling[j]:<5.2f}"
                     f"{now.update[j]:>5.2f}->{proposed.update[j]:.2f}")  # fmt: skip
    lines += ["", f"{'predicted':<22}{'now':>10}{'proposed':>10}"]
    for label, a, b in (("step (s)", now.step, proposed.step),
                        ("idle fraction", now.idle_frac, proposed.idle_frac),
                        ("answers per second", now.answers_per_second, proposed.answers_per_second)):  # fmt: skip
        lines.append(f"{label:<22}{a:>10.3f}{b:>10.3f}")
    (plo, phi), (mlo, mhi) = advice.idle_now, advice.measured_idle
    lines.append(f"(measured: step {costs.measured['time/step']:.3f} s, idle fraction {mlo:.3f}-{mhi:.3f}; today's "
                 f"idle fraction predicted from one step's costs alone: {plo:.3f}-{phi:.3f})")  # fmt: skip
    if not costs.concurrent:
        lines.append("runtime.backend=local runs the agents one after another; the prediction is for concurrent "
                     "agents (runtime.backend=ray, or a device each)")  # fmt: skip
    changes = [f"agents.{j}.group_size={g}" for j, (g, g0) in enumerate(zip(proposed.group_sizes, now.group_sizes,
                                                                           strict=True)) if g != g0]  # fmt: skip
    if proposed.foreign_cap is not None and proposed.foreign_cap != costs.foreign_cap:
        changes.append(f"sharing.budget_per_prompt={proposed.foreign_cap}")
        lines.append(f"every learner trains on every answer today, so more answers would lengthen the slowest update; "
                     f"with sharing.budget_per_prompt={proposed.foreign_cap} each learner trains on at most "
                     f"{proposed.foreign_cap} foreign answers a prompt (those of largest |rho A|), and the budgets "
                     "below pay")  # fmt: skip
    lines.append("set: " + " ".join(changes) if changes else "no budget change keeps the step within its slack")
    lines.append(_between_runs(advice))
    return "\n".join(lines)


def _between_runs(advice: Advice) -> str:
    """How much the proposal varies between measurements (each its own run), or how to find out."""
    runs = advice.between_runs
    if not runs:
        return ("one measurement: a second run of the same config on the same machine can propose other budgets (its "
                "costs differ more than its steps do); `--runs 2` measures twice and says by how much")  # fmt: skip
    names = advice.costs.names
    sizes = "; ".join(f"{name} {', '.join(str(p.group_sizes[j]) for p in runs)}" for j, name in enumerate(names))
    idle = [p.idle_frac for p in runs]
    caps = {p.foreign_cap for p in runs}
    budget = f"; sharing budget {', '.join(str(p.foreign_cap) for p in runs)}" if len(caps) > 1 else ""
    return (
        f"between the {len(runs)} measurements (each its own run), the proposal of each alone: G {sizes}{budget}; "
        f"its predicted idle fraction {min(idle):.3f}-{max(idle):.3f} (the proposal above pools their steps)"
    )
