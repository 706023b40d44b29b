"""What runs inside an agent's worker (in the driver's process, or in a Ray actor): the agent's model, tokenizer and
optimizer (`model`, `precision`), its samplers and generation (`samplers`, `rollout`), teacher-forced log-probs
(`logprobs`), a learner's rows in its own tokens (`exchange`), the worker that answers the driver's calls (`worker`),
and one rank of an agent on K devices (`sharded`, FSDP2 mechanics in `distributed`). Nothing here imports the driver:
the two sides meet only in `hacrl.messages`.
"""
