"""Prompts, gold answers and rewards: the training and evaluation data (`data`; from `datasets`, files or
reasoning-gym: `sources`; the paper's sets by name come from `hacrl.named_sets`), a response's final answer and
the math verifier (`answers`) and the reward functions (`rewards`), which the driver's scoring processes call.
"""
