"""HACPO beyond language models: heterogeneous control policies that share episodes (`hacrl control CONFIG`).

The same algorithms as the LLM trainer (GSPO, GSPOx2, naive sharing, HACPO and its ablation switches), from the same
pure functions of `hacrl.core`, unchanged, on a control task. The analogy, term by term:

    LLM trainer                               control trainer
    prompt                                    an initial state: a seeded reset of the environment
    G responses per prompt and agent          G episodes per initial state and policy
    reward of a response (verifier)           reward of an episode (the share of the distance to the landmark closed)
    tokens of a response                      the actions of an episode, one per environment step
    per-token log-probs                       per-step log-probs log pi(a_t | o_<=t)
    re-tokenization of another agent's text   re-observation of another policy's episode: its logged environment
                                              states seen through the learner's own observation function; its
                                              actions kept
    what crosses between agents               the episode's states and actions (the "text"), reward, source id, the
                                              source's summed log-prob and step count; never parameters or logits

**The environment: the Multi-agent Particle Environments (MPE), `mpe2`'s `simple_v3`** (Farama's maintained MPE,
a PettingZoo environment, in an optional extra: `pip install "hacrl[control]"`). Why this one:
- it is the family the method's descriptions report heterogeneous agents on, and a real library, not ours;
- its full state (the agent's position and velocity, the landmark's position) is a handful of numbers that can be
  read from `env.unwrapped.world` after every step, so an episode can be logged as states and seen again through
  any observation function, exactly (`observations.py`; the environment's own observation is one of them, and a
  test checks that re-observation equals what the env returned);
- its dynamics are deterministic given the reset seed and the actions, so a policy that "acted the same" would
  have seen exactly the re-observed sequence;
- one episode is 25 steps of a 2-D point mass with 5 discrete actions: a policy trains in minutes on 2 CPU cores,
  and the task still asks for control (reaching the landmark is easy, stopping on it is not).
The agents are heterogeneous in what they see and in architecture: `observation: full` is the environment's own
observation (velocity and the landmark's relative position), `observation: polar` the landmark's distance and
direction only (no velocity: a partial view that a recurrent policy can integrate); `architecture: mlp` acts on the
current observation, `architecture: gru` on the history.

**A second environment, on MuJoCo: robot arms that differ in their actuators** (`env.name: reach`, `arms`): a
two-joint and a three-joint planar arm bring their fingertip to a goal, each acting in its own action space (joint
speeds, a Gaussian policy: `policies`). Policies on one platform share episodes as above; between platforms an
episode's actions mean nothing to the other's policy: a learner replays the source's fingertip path on its own arm
through a mapping (`mapping`: its kinematics, or an inverse model fitted on its own transitions) and trains on the
replay. Experience buffers (`buffers`, `sharing.replay`) keep each policy's episodes of its last steps for the
others to draw from.

Modules: `env` (seeded episodes, logged states; each policy's environment), `observations` (the particle
environment's views), `arms` (the MuJoCo arms, their kinematics and views), `mapping` (replays across action
spaces), `buffers` (experience buffers), `policies` (MLP, GRU; discrete or Gaussian actions), `config`, `trainer`
(the loop, checkpoints, metrics in the LLM trainer's formats).
"""
