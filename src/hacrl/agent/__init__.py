"""What runs inside an agent's processes (in the driver's process, a rank's, or a Ray actor): the agent's model,
tokenizer and optimizer (`model`, `precision`), its samplers and generation (`samplers`, `rollout`), teacher-forced
log-probs (`logprobs`), a learner's rows in its own tokens (`exchange`), which of the others' rows it trains on
(`sharing`); the worker that answers the driver's calls (`worker`) and the two roles it holds by composition: sampling
(`sampling`: answers, behaviour log-probs, the proximal pass, the random stream) and learning (`learning`: the update,
the optimizer's checkpoint part), each given the share of a batch its process handles (`share`: one worker, a
worker group's rank, a sampler of its own); the weights a learner hands its sampler (`weightsync`), FSDP2 mechanics
for an agent on K devices (`distributed`), the one-message stops for out-of-memory and non-finite values
(`guards`), and what a worker's process does with the host memory it frees (`host_memory`). Nothing here imports
the driver: the two sides meet only in `hacrl.messages`.
"""
