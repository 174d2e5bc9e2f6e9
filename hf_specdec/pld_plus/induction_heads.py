"""Induction heads for PLD+(a) (PLD+, arXiv:2412.01447, §4.2.1, §5.5, App. B.1): find them and write the heads file.

Identification (§4.2.1): generate greedy outputs for a set of prompts; for every generated token ``o_t`` that occurs
earlier in the context, take the occurrence ``r*`` with the longest common suffix with the output so far (the
place ``o_t`` was most plausibly copied from), and count, for every head of every layer, whether the attention row
of the query that produced ``o_t`` (``x_{t-1}``) has its maximum at ``r*``. Heads are ranked by their hit rate;
PLD+(a) uses the top ones (App. B.1 found 50 of Vicuna-7B's 1024 best; the number is a hyper-parameter).

The heads file (its format, reading and checking it) is ``heads_file.py``, re-exported here; decoding imports
only that module, so an exported ``custom_generate`` folder does not carry this command.

Command: ``hf-specdec find-heads --task summarize --limit 10 --out heads.json [--model PATH]``.
"""

from __future__ import annotations

import torch

from ..errors import SpecDecError
from ..options import add_model_arguments
from .attention_capture import capture_selected_attention
from .heads_file import (  # noqa: F401  (re-exported: the heads file's API)
    DEFAULT_HEADS_FILE,
    FORMAT,
    default_heads_file,
    load_heads_doc,
    read_heads_file,
    write_heads_file,
)


# --------------------------------------------------------------------------------------------- identification
def copy_sources(seq: torch.Tensor, start: int, max_overlap: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """For each position ``p >= start`` of the 1-D ``seq``: ``r*``, the earlier position holding the same token
    with the longest common suffix (ties: the latest), and that suffix length; ``r* = -1`` when the token does not
    occur before ``p``."""
    n = seq.shape[0]
    sources = torch.full((n - start,), -1, dtype=torch.long, device=seq.device)
    overlaps = torch.zeros(n - start, dtype=torch.long, device=seq.device)
    for i, p in enumerate(range(start, n)):
        occ = (seq[:p] == seq[p]).nonzero().squeeze(1)
        if occ.numel() == 0:
            continue
        length = torch.ones_like(occ)
        alive = torch.ones_like(occ, dtype=torch.bool)
        for back in range(1, max_overlap):
            if p - back < 0:
                break
            prev = occ - back
            alive &= prev >= 0
            alive &= seq[prev.clamp(min=0)] == seq[p - back]
            if not alive.any():
                break
            length += alive.long()
        best = int(torch.argmax(length * (n + 1) + occ))
        sources[i], overlaps[i] = occ[best], length[best]
    return sources, overlaps


@torch.no_grad()
def find_induction_heads(
    model,
    prompts: list[torch.Tensor],
    max_new_tokens: int = 64,
    min_overlap: int = 1,
    progress: bool = False,
) -> tuple[torch.Tensor, int]:
    """Hit counts ``(num_layers, num_heads)`` of §4.2.1 over greedy generations for ``prompts`` (1-D id tensors)
    and the number of copy events counted."""
    cfg = model.config.get_text_config()
    n_layers, n_heads = cfg.num_hidden_layers, cfg.num_attention_heads
    hits = torch.zeros(n_layers, n_heads, dtype=torch.long, device="cpu")  # counted on the host (see argmax)
    events = 0
    all_heads = {layer: torch.arange(n_heads, device=model.device) for layer in range(n_layers)}
    iterator = prompts
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(prompts, desc="find-heads", unit="prompt")
    for prompt in iterator:
        prompt = prompt.reshape(1, -1).to(model.device)
        seq = model.generate(
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=max_new_tokens, do_sample=False
        )[0]
        start = prompt.shape[1]
        if seq.shape[0] <= start:
            continue
        sources, overlaps = copy_sources(seq.cpu(), start)
        valid = (sources >= 0) & (overlaps >= min_overlap)
        if not valid.any():
            continue
        rows = seq.shape[0] - start + 1  # queries start-1 .. n-1 (query p-1 produced token p)
        with capture_selected_attention(model, all_heads, last_rows=rows):
            out = model(seq[None], output_attentions=True, use_cache=False, logits_to_keep=1)
        attentions = [a for a in out.attentions if a is not None]
        if len(attentions) != n_layers:
            raise SpecDecError(
                f"find-heads: {type(model).__name__} returned attentions for {len(attentions)} of {n_layers} layers"
            )
        for layer, att in enumerate(attentions):
            att = att[0, :, -rows:]  # (heads, rows, keys); eager models return all rows
            argmax = att[:, :-1].float().argmax(dim=-1).cpu()  # the query of token p is row p - start
            hits[layer] += ((argmax == sources[None]) & valid[None]).sum(dim=1)
        events += int(valid.sum())
    return hits, events


def rank_heads(hits: torch.Tensor, events: int) -> list[dict]:
    """Heads with at least one hit, best hit rate first (ties: lower layer, then lower head)."""
    flat = [
        (int(hits[layer, head]), layer, head)
        for layer in range(hits.shape[0])
        for head in range(hits.shape[1])
        if hits[layer, head] > 0
    ]
    flat.sort(key=lambda x: (-x[0], x[1], x[2]))
    return [
        {"layer": layer, "head": head, "score": round(count / max(events, 1), 6)}
        for count, layer, head in flat
    ]


# ------------------------------------------------------------------------------------------------------ CLI
def add_parser(sub) -> None:
    p = sub.add_parser(
        "find-heads",
        help="find a model's induction heads for PLD+(a) and write a heads file",
        description="PLD+ (arXiv:2412.01447) §4.2.1: greedy-generate for the task's prompts and rank every attention head by "
        "how often its maximum attention falls on the context position the generated token was copied from.",
    )
    add_model_arguments(p, "--model", "a causal LM")
    p.add_argument("--task", default="summarize", help="task whose prompts are used (default: summarize)")
    p.add_argument("--limit", type=int, default=10, help="number of prompts (default 10)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument(
        "--min-overlap",
        type=int,
        default=1,
        help="count a token only if its copy source shares at "
        "least this many trailing tokens with the output (default 1, the paper's procedure)",
    )
    p.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], default="fp32")
    p.add_argument("--out", required=True, help="heads file to write (JSON)")
    p.add_argument("--show", type=int, default=10, help="print the top N heads (default 10)")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..target import load_target
    from ..tasks import load_task

    if args.limit < 1 or args.max_new_tokens < 1:
        raise SpecDecError("--limit and --max-new-tokens must be at least 1")
    load_task(args.task, None, 1)  # unknown task: fail before loading the model
    model, tokenizer = load_target(args.model, args.dtype, gguf_file=args.gguf_file)
    ds = load_task(args.task, tokenizer, args.limit)
    prompts = [tokenizer(row["prompt"], return_tensors="pt").input_ids[0] for row in ds]
    hits, events = find_induction_heads(
        model, prompts, args.max_new_tokens, min_overlap=args.min_overlap, progress=True
    )
    if events == 0:
        raise SpecDecError(
            f"no generated token of task {args.task!r} was found in its context; use another task"
        )
    heads = rank_heads(hits, events)
    path = write_heads_file(
        args.out,
        model,
        heads,
        task=args.task,
        prompts=len(prompts),
        max_new_tokens=args.max_new_tokens,
        min_overlap=args.min_overlap,
        events=events,
        command=getattr(args, "command_line", ""),
    )
    for rank, h in enumerate(heads[: args.show], 1):
        print(f"{rank:3d}. layer {h['layer']:3d} head {h['head']:3d}  hit rate {h['score']:.3f}")
    print(f"wrote {path} ({len(heads)} heads with hits, {events} copy events)")
    return 0
