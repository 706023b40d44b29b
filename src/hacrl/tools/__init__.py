"""The command line and the tools around a run: `cli` (every `hacrl` command), `plan` (device and host memory per
agent), `export` (a trained agent as a plain Hugging Face model), `plot` (training curves).
"""
