"""Attention for the compiled decode step: grouped key/value heads read in place.

transformers' `sdpa` attention handles a one-token decode step with grouped-query attention (fewer key/value heads
than query heads) by folding the query heads of each group into the query-length axis (`pack_gqa`), so that
attention reads the cache as it is - but only eagerly: under `torch.compile` it takes the general path, which
expands every key and value head of the whole cache (`repeat_kv`) before attention, every layer, every token. On a
GPU that copy was most of a static decode step (benchmarks/results/gpu-h100.md: 17 of 32 ms per step on a Qwen3-0.6B
shape). `grouped_decode_sdpa` does the eager fold in the compiled step too, and hands everything else (prefill,
training, masks that differ per head, dropout) to transformers' own function unchanged.

`use_grouped_decode(model)` switches a model that runs on `sdpa` to it. The choice lives in the model's config only
in memory (transformers never writes it into a saved config.json), so a saved agent loads without hacrl.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.integrations.sdpa_attention import sdpa_attention_forward

NAME = "hacrl_grouped_decode_sdpa"


def grouped_decode_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers' attention-function signature: query (B, H, Q, D), key/value (B, Hkv, L, D) -> (B, Q, H, D)."""
    groups = getattr(module, "num_key_value_groups", 1)
    shared_mask = attention_mask is None or attention_mask.shape[1] == 1
    plain = kwargs.get("position_bias") is None and kwargs.get("softcap") is None and not dropout
    if query.shape[2] != 1 or groups == 1 or not shared_mask or not plain:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    batch, heads, _, dim = query.shape
    # query head h = kv_head * groups + r (repeat_kv's order): fold r into the query axis of its key/value head
    out = F.scaled_dot_product_attention(
        query.reshape(batch, heads // groups, groups, dim), key, value, attn_mask=attention_mask, scale=scaling
    )
    return out.reshape(batch, heads, 1, value.shape[-1]).transpose(1, 2).contiguous(), None


def use_grouped_decode(model: torch.nn.Module) -> bool:
    """Run `model`'s attention through `grouped_decode_sdpa` if it runs on `sdpa` and has grouped key/value heads;
    whether it was switched."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    config = model.config
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if config._attn_implementation != "sdpa" or not heads or kv_heads == heads:
        return False
    if NAME not in AttentionInterface._global_mapping:
        AttentionInterface.register(NAME, grouped_decode_sdpa)
        ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)  # the same masks as sdpa
    model.set_attn_implementation(NAME)
    return config._attn_implementation == NAME
