"""What runs inside an agent's worker (in the driver's process, or in a Ray actor): the agent's model, tokenizer and
optimizer (`model`, `precision`), its samplers and generation (`samplers`, `rollout`), teacher-forced log-probs
(`logprobs`), a learner's rows in its own tokens (`exchange`), which of the others' rows it trains on (`sharing`), the
worker that answers the driver's calls (`worker`), a sampler of its own in its own process (`sampler_worker`) and the
weights its learner hands it (`weightsync`), one rank of an agent on K devices (`sharded`, FSDP2 mechanics in
`distributed`), and the one-message stops for out-of-memory and non-finite values (`guards`). Nothing here imports
the driver: the two sides meet only in `hacrl.messages`.
"""
