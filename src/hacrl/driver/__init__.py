"""What the driver runs: the training step at any lag, and which role of which agent does what in it and in which order
(`trainer`: `Trainer` and its `Schedule`), the run around the steps that `hacrl control` shares (`runloop`: directory
lock, logger, evaluation and checkpoint schedule, graceful stop), where the workers live and how a call reaches one
(`backends`: transports), the deadline of every call to a worker process (`supervision`), how long each agent waits
on the others and what would use it (`pace`), what a run does with its directory (`resume`, `rundir`), scoring in
time-limited processes (`scoring`), evaluation's scoring and records, the metrics registry and logging (`metrics`,
`logger`). The fixed-lag pipeline's batches in flight are `hacrl.inflight`'s. It talks to agents only through
`hacrl.messages`: only `backends` imports `hacrl.agent`, to start the workers (tests/test_repository.py checks it).
"""
