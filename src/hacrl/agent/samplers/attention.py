"""Decode attention over the filled part of the static sampler's KV pool.

In a decode step every row adds one token at its own position and attends to its own filled positions
`0 .. position` of the pool (prompts are stored left-aligned: no left padding, no unfilled tail). The lengths live
in a device tensor (the step's `position_ids`), so the captured CUDA graph stays the same while rows grow at
different speeds.

`decode_attention` is a custom op (`hacrl::decode_attention`), opaque to torch.compile (its shapes are declared
by a fake implementation), with two implementations of one contract:

- on a CUDA device, a Triton kernel in the split-K "flash decoding" pattern: one program per (row, key/value head,
  split of the positions) loads the query heads of its group once, walks only the blocks below the row's length
  (a split past it exits at once), keeps a running max and sum; with one split it normalises and writes the output
  itself, with several a second small kernel combines the splits (one launch, not a chain of torch operations: in
  a captured decode step every layer's kernels count). The number of splits grows as rows get few, so a small
  batch of long rows still fills the GPU.
- everywhere else (and as the reference the kernel is tested against): plain torch, masked scaled-dot-product
  attention over the pool (reads every position, which on a CPU costs little).

`use_static_decode(model)` switches the model's attention to `static_decode_attention`: when called with
`hacrl_static_decode=True` (the static sampler's decode step), the decode path above; otherwise (prefill,
training, evaluation) the model's own attention function, unchanged, with its own masks. The choice lives in the
model's config only in memory (transformers never writes it into config.json), so a saved agent loads without
hacrl.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from hacrl.agent.samplers.base import next_power_of_two

NAME = "hacrl_static"
"""The attention implementation's name prefix (one per original implementation: `hacrl_static_sdpa`, ...)."""
FLAG = "hacrl_static_decode"
"""The keyword the decode step passes through the model to its attention layers and its cache."""


def reference_decode_attention(query: Tensor, key: Tensor, value: Tensor, lengths: Tensor, scale: float) -> Tensor:
    """query (B, H, D), key/value (B, Hkv, L, D), lengths (B,) -> (B, H, D): each row attends to positions
    `0 .. lengths[b] - 1` of its keys; query head h reads key/value head h // (H / Hkv) (transformers' repeat_kv
    order)."""
    batch, heads, dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    valid = torch.arange(length, device=key.device)[None, :] < lengths[:, None]  # (B, L)
    out = F.scaled_dot_product_attention(
        query.reshape(batch, kv_heads, groups, dim),
        key,
        value,
        attn_mask=valid[:, None, None, :],
        scale=scale,
    )
    return out.reshape(batch, heads, value.shape[-1])


@torch.library.custom_op("hacrl::decode_attention", mutates_args=())
def decode_attention(query: Tensor, key: Tensor, value: Tensor, lengths: Tensor, scale: float) -> Tensor:
    """See `reference_decode_attention`; on CUDA with Triton, the kernel that reads only the filled positions."""
    if query.is_cuda and _triton_kernel() is not None:
        return _triton_decode(query, key, value, lengths, scale)
    return reference_decode_attention(query, key, value, lengths, scale)


@decode_attention.register_fake
def _(query, key, value, lengths, scale):
    return query.new_empty(query.shape[0], query.shape[1], value.shape[-1])


# -- the Triton kernel ------------------------------------------------------------------------------------------------

KERNEL_CONFIG = {"block_n": 64, "num_warps": 4, "num_stages": 2, "target_programs": 1024}
"""The kernel's launch: positions per inner block (`block_n`), Triton's warps and pipeline stages, and the programs
that splits are added up to (rows x key/value heads x splits, several per SM). A module setting so that
`benchmarks/gpu_throughput.py --only kernel` can time the alternatives on a GPU; the sampler captures the launch
it finds when it records its graphs."""
MIN_SPLIT = 256
"""A split covers at least this many positions (fewer would cost more in the combine than they save)."""

_KERNEL: object = False  # False: not tried yet; None: Triton unavailable


def _triton_kernel():
    global _KERNEL
    if _KERNEL is False:
        try:
            _KERNEL = _build_kernel()
        except Exception:  # noqa: BLE001 - no Triton (CPU builds of torch): the reference path
            _KERNEL = None
    return _KERNEL


def split_plan(batch: int, kv_heads: int, length: int) -> tuple[int, int]:
    """(splits, positions per split) for a call: enough programs to fill the GPU, each split a multiple of the
    kernel's block and at least MIN_SPLIT positions."""
    block, target = KERNEL_CONFIG["block_n"], KERNEL_CONFIG["target_programs"]
    splits = max(1, min(-(-target // (batch * kv_heads)), -(-length // MIN_SPLIT)))
    per_split = -(-length // splits)
    per_split = -(-per_split // block) * block
    return -(-length // per_split), per_split


def _triton_decode(query: Tensor, key: Tensor, value: Tensor, lengths: Tensor, scale: float) -> Tensor:
    batch, heads, dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    assert key.stride(-1) == 1 and value.stride(-1) == 1, "the pool's head dimension must be contiguous"
    query = query.contiguous()
    splits, per_split = split_plan(batch, kv_heads, length)
    out = torch.empty((batch, heads, dim), dtype=query.dtype, device=query.device)
    direct = splits == 1  # one split: the kernel normalises and writes the output itself
    if direct:  # no partial sums: the unused pointers are the output's, their strides 0
        acc = top = total = out
        acc_strides, stat_strides = (0, 0, 0, 0), (0, 0, 0)
    else:
        acc = torch.empty((batch, kv_heads, splits, groups, dim), dtype=torch.float32, device=query.device)
        stats = torch.empty((2, batch, kv_heads, splits, groups), dtype=torch.float32, device=query.device)
        top, total = stats[0], stats[1]  # per split: running max and sum of exp(score - max)
        acc_strides, stat_strides = acc.stride()[:4], stats.stride()[1:4]
    block_g = max(16, next_power_of_two(groups))
    kernel, combine = _KERNEL
    kernel[(batch, kv_heads, splits)](
        query, key, value, lengths, acc, top, total, out, scale, groups, per_split,
        query.stride(0), query.stride(1),
        key.stride(0), key.stride(1), key.stride(2),
        value.stride(0), value.stride(1), value.stride(2),
        *acc_strides, *stat_strides, out.stride(0), out.stride(1),
        dim, D=max(16, next_power_of_two(dim)), BLOCK_G=block_g, BLOCK_N=KERNEL_CONFIG["block_n"],
        IEEE=query.dtype == torch.float32, DIRECT=direct,
        num_warps=KERNEL_CONFIG["num_warps"], num_stages=KERNEL_CONFIG["num_stages"],
    )  # fmt: skip
    if not direct:  # the splits' partial sums, weighted by exp(their max - the row's max), in one more kernel
        combine[(batch, kv_heads)](
            acc, top, total, out, splits, groups, dim,
            *acc_strides, *stat_strides, out.stride(0), out.stride(1),
            D=max(16, next_power_of_two(dim)), BLOCK_G=block_g,
        )  # fmt: skip
    return out


def _build_kernel():
    """The split kernel (each program: one row, one key/value head, one split of the row's positions) and the
    kernel that combines the splits' partial results."""
    return _split_kernel(), _combine_kernel()


def _split_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(
        Q, K, V, Lengths, Acc, Max, Sum, Out, scale, groups, per_split,
        sqb, sqh, skb, skh, skn, svb, svh, svn, sab, sah, sas, sag, smb, smh, sms, sob, soh, dim,
        D: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr, DIRECT: tl.constexpr,
    ):  # fmt: skip
        row = tl.program_id(0)
        head = tl.program_id(1)
        split = tl.program_id(2)
        length = tl.load(Lengths + row)
        start = split * per_split
        end = tl.minimum(start + per_split, length)
        g = tl.arange(0, BLOCK_G)
        d = tl.arange(0, D)  # D: the head dim padded to a power of two
        n = tl.arange(0, BLOCK_N)
        in_group = g < groups
        in_dim = d < dim
        q = tl.load(Q + row * sqb + (head * groups + g)[:, None] * sqh + d[None, :],
                    mask=in_group[:, None] & in_dim[None, :], other=0.0)  # fmt: skip
        top = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
        total = tl.zeros([BLOCK_G], dtype=tl.float32)
        acc = tl.zeros([BLOCK_G, D], dtype=tl.float32)
        k_base = K + row * skb + head * skh
        v_base = V + row * svb + head * svh
        for first in range(start, end, BLOCK_N):
            pos = first + n
            inside = pos < end
            k = tl.load(k_base + pos[:, None] * skn + d[None, :], mask=inside[:, None] & in_dim[None, :], other=0.0)
            if IEEE:
                scores = tl.dot(q, tl.trans(k), input_precision="ieee")
            else:
                scores = tl.dot(q, tl.trans(k))
            scores = tl.where(inside[None, :], scores * scale, float("-inf"))
            new_top = tl.maximum(top, tl.max(scores, 1))
            alpha = tl.exp(top - new_top)
            p = tl.exp(scores - new_top[:, None])
            total = total * alpha + tl.sum(p, 1)
            v = tl.load(v_base + pos[:, None] * svn + d[None, :], mask=inside[:, None] & in_dim[None, :], other=0.0)
            if IEEE:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            top = new_top
        mask = in_group[:, None] & in_dim[None, :]
        if DIRECT:  # the only split: every row has a position, so total > 0
            out = acc / total[:, None]
            tl.store(Out + row * sob + (head * groups + g)[:, None] * soh + d[None, :],
                     out.to(Out.dtype.element_ty), mask=mask)  # fmt: skip
        else:
            tl.store(Acc + row * sab + head * sah + split * sas + g[:, None] * sag + d[None, :], acc, mask=mask)
            stat = row * smb + head * smh + split * sms + g
            tl.store(Max + stat, top, mask=in_group)
            tl.store(Sum + stat, total, mask=in_group)

    return kernel


def _combine_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def combine(
        Acc, Max, Sum, Out, splits, groups, dim, sab, sah, sas, sag, smb, smh, sms, sob, soh,
        D: tl.constexpr, BLOCK_G: tl.constexpr,
    ):  # fmt: skip
        row = tl.program_id(0)
        head = tl.program_id(1)
        g = tl.arange(0, BLOCK_G)
        d = tl.arange(0, D)
        in_group = g < groups
        mask = in_group[:, None] & (d < dim)[None, :]
        stat = Max + row * smb + head * smh + g
        best = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
        for i in range(0, splits):  # split 0 always holds position 0: best is finite
            best = tl.maximum(best, tl.load(stat + i * sms, mask=in_group, other=float("-inf")))
        out = tl.zeros([BLOCK_G, D], dtype=tl.float32)
        denominator = tl.zeros([BLOCK_G], dtype=tl.float32)
        for i in range(0, splits):  # a split past the row's length has max -inf: weight 0
            weight = tl.exp(tl.load(stat + i * sms, mask=in_group, other=float("-inf")) - best)
            weight = tl.where(in_group, weight, 0.0)
            total = tl.load(Sum + row * smb + head * smh + i * sms + g, mask=in_group, other=0.0)
            denominator += total * weight
            part = tl.load(Acc + row * sab + head * sah + i * sas + g[:, None] * sag + d[None, :], mask=mask,
                           other=0.0)  # fmt: skip
            out += part * weight[:, None]
        out = out / tl.where(in_group, denominator, 1.0)[:, None]
        tl.store(Out + row * sob + (head * groups + g)[:, None] * soh + d[None, :], out.to(Out.dtype.element_ty),
                 mask=mask)  # fmt: skip

    return combine


# -- wiring into transformers' attention interface --------------------------------------------------------------------


def static_decode_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers' attention-function signature. With `hacrl_static_decode=True`: query (B, H, 1, D) attends to
    the pool slices `key`/`value` (B, Hkv, L, D) up to each row's `position_ids` + 1 -> (B, 1, H, D). Otherwise the
    model's own attention function."""
    if not kwargs.get(FLAG):
        original = module.config._attn_implementation.removeprefix(f"{NAME}_")
        return _interface(original)(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    lengths = kwargs["position_ids"][:, 0] + 1
    scale = scaling if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
    out = decode_attention(query[:, :, 0, :], key, value, lengths, float(scale))
    return out[:, None], None


def _interface(name: str):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from transformers.models.llama.modeling_llama import eager_attention_forward

    if name == "sdpa":
        return sdpa_attention_forward
    return ALL_ATTENTION_FUNCTIONS.get(name, eager_attention_forward) if name != "eager" else eager_attention_forward


def unsupported_reason(config) -> str | None:
    """Why the static sampler cannot decode this model (None: it can): it needs full causal attention over every
    earlier position, with no sliding window, soft-capping or attention sinks."""
    layer_types = getattr(config, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types):
        return f"its layers mix attention types ({sorted(set(layer_types))})"
    if getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):
        return "it uses sliding-window attention"
    if getattr(config, "attn_logit_softcapping", None):
        return "it soft-caps attention logits"
    if not getattr(config, "num_attention_heads", None):
        return "its config names no num_attention_heads"
    return None


def use_static_decode(model: torch.nn.Module) -> str:
    """Route `model`'s attention through `static_decode_attention`; returns the implementation's name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    config = model.config
    original = (config._attn_implementation or "eager").removeprefix(f"{NAME}_")
    name = f"{NAME}_{original}"  # the original stays readable from the name: nothing else is stored on the config
    if name not in AttentionInterface._global_mapping:
        AttentionInterface.register(name, static_decode_attention)
        mask = ALL_MASK_ATTENTION_FUNCTIONS._global_mapping.get(original)
        if mask is not None:  # prefill and training build the same masks as the original implementation
            ALL_MASK_ATTENTION_FUNCTIONS.register(name, mask)
    if config._attn_implementation != name:
        model.set_attn_implementation(name)
    return name
