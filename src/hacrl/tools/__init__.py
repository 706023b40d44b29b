"""The command line and the tools around a run: `cli` (every `hacrl` command), `evaluate` (`hacrl eval`: saved agents
loaded into this process), `plan` (device and host memory per agent), `budgets` (`hacrl plan --measure`: rollout
budgets from measured costs), `placement` (`hacrl plan --devices`: devices per agent), `export` (a trained agent as
a plain Hugging Face model), `plot` (training curves), and the built-in test bed (`testbed`).
"""
