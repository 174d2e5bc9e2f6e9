"""The drafter's cost c: one draft forward (the drafter's layer over one token, plus its head) over one forward of the
target over one token, both after the same context and timed on this machine (EDD, ACL 2025, §3.2 calls the two step
times s_d and s_t; c = s_d / s_t). Reported by the bench beside each drafter method, and used by ``draft-vocab`` to
size a draft vocabulary (c(V) for a V-row head)."""

from __future__ import annotations

import torch

from ..hf_compat import CACHE_ARGUMENT
from .timing import device_of, median, seconds


@torch.no_grad()
def draft_step_costs(
    drafter, target, sizes: list[int], context: int = 256, repeats: int = 31
) -> dict[int, float]:
    """``c(V)`` for each V: the drafter's forward over one token (after ``context`` target tokens) plus a V-row head,
    over the target's one-token forward after the same context, both timed here.

    The two sides are timed interleaved: each of ``repeats`` samples times a target step, then the drafter's forward
    and each head, back to back, and ``c(V)`` is the median of the samples' ratios. A 2-core CPU's speed drifts by
    +-20% from one second to the next; timed back to back, both sides of a ratio see the same drift, so a few samples
    give what separately timed medians needed hundreds of calls for (decoding times a drafter on its first step)."""
    from .sliding_window import verification_cache

    device = device_of(target)
    ids = torch.randint(3, target.config.vocab_size, (1, context + 1), device=device)
    cache = verification_cache(target, None)  # the full layers the loops verify into (and GLIDE reads)
    fwd = {k: v for k, v in (drafter.target_forward_kwargs() or {}).items() if k != CACHE_ARGUMENT}
    out = target.base_model(input_ids=ids[:, :-1], **{CACHE_ARGUMENT: cache}, **fwd)

    def target_step():
        target(ids[:, -1:], **{CACHE_ARGUMENT: cache}, logits_to_keep=1)
        cache.crop(-1)

    step_context = drafter.context_from_features(
        {k: v[..., -1:, :] for k, v in drafter.features_from_target(out).items()}, ids[:, -1:]
    )
    head = target.get_output_embeddings().weight
    hidden = torch.randn(1, head.shape[1], dtype=head.dtype, device=device)
    whole = head.shape[0] if drafter.draft_vocab_ids is None else len(drafter.draft_vocab_ids)
    heads = {v: head[: v or whole].contiguous() for v in sizes}

    def layer_step():
        drafter(input_ids=ids[:, -1:], return_hidden_states=True, **step_context)

    def head_call(v: int, rows: torch.Tensor):
        if v == 0:  # the drafter's own head, on whatever kernels it runs (hf_specdec.apply_kernels)
            return lambda: drafter.draft_logits(hidden)
        return lambda: torch.nn.functional.linear(hidden, rows)

    calls = [target_step, layer_step] + [head_call(v, rows) for v, rows in heads.items()]
    for fn in calls:  # warm-up, untimed
        fn()
    ratios: dict[int, list[float]] = {v: [] for v in sizes}
    for _ in range(repeats):
        t_target, t_layer, *t_heads = (seconds(fn, device) for fn in calls)
        for v, t_head in zip(heads, t_heads):
            ratios[v].append((t_layer + t_head) / t_target)
    return {v: median(r) for v, r in ratios.items()}


def drafter_cost(drafter, target, context: int = 256, repeats: int = 31) -> float:
    """c of ``drafter`` with its own head (its draft vocabulary, or the whole one) on ``target``: the median of
    ``repeats`` interleaved samples."""
    return draft_step_costs(drafter, target, [0], context, repeats)[0]


def costs_by_dtype(drafter, target) -> dict:
    """c in fp32 and in bf16 (copies cast to bf16; the originals are untouched) and the machine they were timed on:
    what a drafter's model card records."""
    import copy

    from ..machine import describe_machine, machine_line

    costs = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        d = copy.deepcopy(drafter).to(dtype)  # the copy carries its own copy of the attached target
        t = d.target.to(dtype)
        costs[name] = round(drafter_cost(d, t), 4)
        del d, t
    costs["machine"] = machine_line(describe_machine(device_of(target)))
    return costs
