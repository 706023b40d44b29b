"""hacrl: Heterogeneous Agent Collaborative Reinforcement Learning (HACPO) for Hugging Face causal LMs.

Importing `hacrl` is cheap: the algorithm core lives in `hacrl.core` and is imported on demand.
"""

__version__ = "0.1.0.dev0"
