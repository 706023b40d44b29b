"""HACPO's equations on one shared prompt, printed step by step (runs in a second on a CPU).

Two agents with different capabilities answer the same prompt G = 4 times each. We show what each learner's
baseline, advantages, capability coefficients and stepwise clipping bounds come out as, and how a foreign
response's loss term reacts to its sequence ratio.  Run: `python examples/hacpo_by_hand.py`.
"""

import torch

from hacrl.core import (
    AlgorithmParams,
    CapabilityTracker,
    foreign_lower_bound,
    foreign_objective,
    get_algorithm,
    step_mean_rewards,
)

NAMES = ["llama-char", "qwen-bpe"]
params = AlgorithmParams()
hacpo = get_algorithm("hacpo")

# one prompt, G = 4 responses per agent; agent 1 is the stronger one this step
rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0])
source = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
group = torch.zeros(8, dtype=torch.long)

tracker = CapabilityTracker(num_agents=2, window=5)
for past in ([0.20, 0.50], [0.30, 0.60]):  # two earlier steps
    tracker.update(past)
tracker.update(step_mean_rewards(rewards, source, num_agents=2))
caps = tracker.capabilities()
print(
    "capabilities P_hat (window 5, this step included):",
    {n: round(float(c), 4) for n, c in zip(NAMES, caps, strict=True)},
)
print(f"rewards: {NAMES[0]} {rewards[:4].tolist()}   {NAMES[1]} {rewards[4:].tolist()}\n")

for k, name in enumerate(NAMES):
    w = tracker.baseline_weights(k)
    rho = tracker.loss_coefficients(k)
    adv = hacpo.advantages(rewards, group, source, learner=k, capabilities=caps, params=params)
    naive = get_algorithm("naive").advantages(rewards, group, source, learner=k, capabilities=caps, params=params)
    print(
        f"learner {name}: baseline weights w = {[round(float(x), 3) for x in w]}, "
        f"loss coefficients rho = {[round(float(x), 3) for x in rho]}"
    )
    print(f"  HACPO advantages: {[round(float(a), 3) for a in adv]}")
    print(f"  naive advantages: {[round(float(a), 3) for a in naive]}")

print(
    "\nforeign lower bound lo_m per mini-batch m:",
    [round(foreign_lower_bound(m, delta=params.delta, delta_step=params.delta_step), 3) for m in range(6)],
)
print("foreign objective s_hat * sg(s_hat)^alpha * rho * A at m = 0 (rho = 1.5, A = +1):")
for s in (0.5, 0.8, 0.9, 1.0, 1.3):
    ratio = torch.tensor([s], requires_grad=True)
    obj, clipped = foreign_objective(ratio, torch.ones(1), torch.tensor([1.5]), lower=0.8, alpha=params.alpha)
    (grad,) = torch.autograd.grad(obj.sum(), ratio)
    note = "  (clipped: no gradient)" if clipped else ""
    print(f"  s = {s:.2f}: objective {float(obj.detach()):.3f}, d/ds {float(grad):.3f}{note}")
