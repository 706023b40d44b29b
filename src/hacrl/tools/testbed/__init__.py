"""The built-in test bed: tiny tokenizers and models built from code (`models`), a supervised warm-start (`sft`)
the demo that bootstraps two agents and trains them (`demo`), and the one real model, fetched from the package
registry and converted (`real`). Nothing here is needed to train your own
agents; the library's rooms are `hacrl.core`, the worker, the driver and the backends.

Importing this package is cheap; the names below load their module on first use.
"""

from __future__ import annotations

_NAMES = {
    "CHAT_TEMPLATE": "models",
    "bpe_tokenizer": "models",
    "char_tokenizer": "models",
    "save_agent": "models",
    "tiny_model": "models",
}


def __getattr__(name: str):
    if name in _NAMES:
        import importlib

        return getattr(importlib.import_module(f"hacrl.tools.testbed.{_NAMES[name]}"), name)
    raise AttributeError(f"module 'hacrl.tools.testbed' has no attribute {name!r}")
