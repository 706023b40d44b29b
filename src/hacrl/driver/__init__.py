"""What the driver runs: the training loop (`trainer`) and where the workers live (`backends`), what a run does
with its directory (`resume`, `rundir`), scoring in time-limited processes (`scoring`), evaluation, the metrics
registry and logging (`metrics`, `logger`). It talks to agents only through `hacrl.messages`.
"""
