"""``hf-specdec pld-tune``: PLD+'s hyper-parameters (K, layer l, number of heads) on one task (pld-plus.txt §5.5).

Greedy verification accepts the longest prefix of a draft that equals the target's own greedy continuation, so for
greedy decoding the whole PLD+ run is determined by the plain greedy output: this command generates it once per
prompt, runs one forward over prompt + output for the artifacts of every layer (hidden states) and every head
(attention rows), and then replays PLD+'s drafting for every setting in the grid, counting accepted tokens. That
gives each setting's tau (tokens per target forward) exactly, in seconds instead of one generation per setting.
Wall time is then estimated from measured target forward times ``t(q)`` for ``q`` query tokens (a verification
forward of a ``K``-token draft has ``q = K + 1``): ``speedup ~ new_tokens * t(1) / sum over steps of t(q)``.
``hf-pld`` (transformers' prompt lookup, 2-gram, 10 tokens) is replayed the same way for reference.
The paper tunes on summarization only; so does the default ``--task summarize``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .errors import SpecDecError
from .pld_plus_generation import DraftLength, occurrences, rank_by_attention, rank_by_hidden

Ranker = Callable[[torch.Tensor], "int | None"]


@dataclass
class Replay:
    new_tokens: int = 0
    forwards: int = 0
    verify_sizes: list[int] | None = None

    @property
    def tau(self) -> float:
        return self.new_tokens / self.forwards if self.forwards else 0.0


def replay(
    seq: torch.Tensor, start: int, rank: Ranker, k: int, eos: set[int], max_len: int, max_k: int | None = None
) -> Replay:
    """Replay one greedy PLD-style generation of ``seq[start:]``; ``rank(ids)`` returns the draft's source ``j``
    (the draft is ``ids[j+1 : j+1+K]``, ``K`` from :class:`DraftLength`) or ``None``."""
    n, total = start + 1, seq.shape[0]  # the prefill produced token `start`
    sizes = [start]
    lengths = DraftLength(k, max_k or k)
    while n < total:
        ids = seq[:n]
        budget = max_len - n - 1
        j = rank(ids) if budget > 0 else None
        draft = [] if j is None else seq[j + 1 : min(j + 1 + min(lengths.for_source(j), budget), n)].tolist()
        for i, tok in enumerate(draft):
            if tok in eos:
                draft = draft[: i + 1]
                break
        truth = seq[n : n + len(draft)].tolist()
        accepted = 0
        while accepted < len(truth) and draft[accepted] == truth[accepted]:
            accepted += 1
        lengths.update(j + 1 if draft else None, len(draft), accepted)
        n += accepted + 1
        sizes.append(1 + len(draft))
    return Replay(new_tokens=total - start, forwards=len(sizes), verify_sizes=sizes)


def hf_pld_rank(ngram: int = 2) -> Ranker:
    """transformers' ``PromptLookupCandidateGenerator`` choice: the first (leftmost) match of the last n-gram,
    longest n first, that has at least one token after it."""

    def rank(ids: torch.Tensor) -> int | None:
        n = ids.shape[0]
        for size in range(min(ngram, n - 1), 0, -1):
            windows = ids.unfold(0, size, 1)
            hits = (windows == ids[-size:]).all(dim=1).nonzero().squeeze(1)
            hits = hits[hits + size < n]
            if hits.numel():
                return int(hits[0]) + size - 1
        return None

    return rank


def hidden_rank(unit: torch.Tensor, min_score: float | None = None) -> Ranker:
    def rank(ids: torch.Tensor) -> int | None:
        j, score = rank_by_hidden(unit[: ids.shape[0] - 1], occurrences(ids))
        return None if j is None or (min_score is not None and score < min_score) else j

    return rank


def attention_rank(rows: torch.Tensor, row_offset: int, min_score: float | None = None) -> Ranker:
    """``rows``: (heads, queries, keys) attention of the selected heads; query ``i`` is position ``row_offset+i``."""

    def rank(ids: torch.Tensor) -> int | None:
        n = ids.shape[0]
        j, score = rank_by_attention(rows[:, n - 2 - row_offset, : n - 1], occurrences(ids))
        return None if j is None or (min_score is not None and score < min_score) else j

    return rank


@torch.no_grad()
def forward_times(model, context: torch.Tensor, sizes: list[int], repeats: int = 3) -> dict[int, float]:
    """Median seconds of a cached target forward of ``q`` tokens after ``context``."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    model(context[None], past_key_values=cache, logits_to_keep=1)
    times = {}
    for q in sizes:
        samples = []
        for _ in range(repeats):
            x = context[-q:][None] if q <= context.shape[0] else context[None, :1].repeat(1, q)
            t0 = time.perf_counter()
            model(x, past_key_values=cache, logits_to_keep=q)
            samples.append(time.perf_counter() - t0)
            cache.crop(-q)
        times[q] = sorted(samples)[len(samples) // 2]
    return times


def interpolate(times: dict[int, float], q: int) -> float:
    keys = sorted(times)
    if q <= keys[0]:
        return times[keys[0]]
    for a, b in zip(keys, keys[1:]):
        if q <= b:
            return times[a] + (times[b] - times[a]) * (q - a) / (b - a)
    a, b = keys[-2], keys[-1]
    return times[b] + (times[b] - times[a]) * (q - b) / (b - a)


def _parse_floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SpecDecError(f"expected a comma-separated list of numbers, got {text!r}") from None


def _parse_ints(text: str) -> list[int]:
    return [int(x) for x in _parse_floats(text)]


def add_parser(sub) -> None:
    p = sub.add_parser(
        "pld-tune",
        help="tune PLD+'s K / layer / heads / threshold on a task by exact greedy replay",
        description=__doc__.split("\n\n")[1],
    )
    p.add_argument("--task", default="summarize")
    p.add_argument("--limit", type=int, default=10)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--model", default=None)
    p.add_argument("--layers", default="all", help="hidden-state indices to sweep, or 'all' (default)")
    p.add_argument("--sweep-k", type=int, default=10, help="K while sweeping layers / heads (paper: 10)")
    p.add_argument("--ks", default="5,8,10,12,16,20,30", help="K values tried at the chosen layer / heads")
    p.add_argument(
        "--max-ks", default="16,20,32,40", help="growth caps (pld_max_num_tokens) tried at the best K"
    )
    p.add_argument("--top-heads", default="1,3,5,10,20,50", help="numbers of heads swept for PLD+(a)")
    p.add_argument("--heads", default=None, help="heads file for PLD+(a) (default: the shipped one)")
    p.add_argument(
        "--h-thresholds", default="-1,0.6,0.7,0.8,0.85,0.9", help="PLD+(h) min cosine values tried"
    )
    p.add_argument(
        "--a-thresholds", default="0,0.05,0.1,0.2,0.3,0.4", help="PLD+(a) min attention values tried"
    )
    p.set_defaults(func=run)


def run(args) -> int:
    from .induction_heads import default_heads_file, read_heads_file
    from .pld_plus_generation import capture_selected_attention
    from .target import load_target
    from .tasks import load_task

    model, tokenizer = load_target(args.model, args.dtype)
    ds = load_task(args.task, tokenizer, args.limit)
    eos_ids = model.generation_config.eos_token_id
    eos = {int(eos_ids)} if isinstance(eos_ids, int) else {int(e) for e in eos_ids or []}
    n_layers = model.config.num_hidden_layers
    layers = list(range(n_layers + 1)) if args.layers == "all" else _parse_ints(args.layers)
    ks, tops, max_ks = _parse_ints(args.ks), _parse_ints(args.top_heads), _parse_ints(args.max_ks)
    h_thresholds, a_thresholds = _parse_floats(args.h_thresholds), _parse_floats(args.a_thresholds)
    ranked = read_heads_file(args.heads or default_heads_file(model), model=model, top=max(tops))
    capture = {}
    for layer, head in ranked:
        capture.setdefault(layer, []).append(head)
    capture = {layer: torch.tensor(sorted(hs)) for layer, hs in capture.items()}

    samples = []  # (seq, start, unit hidden states per layer, (heads, rows, keys) attention in ranked order)
    for row in ds:
        prompt = tokenizer(row["prompt"], return_tensors="pt").input_ids
        seq = model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=args.max_new_tokens,
            do_sample=False,
        )[0]
        start = prompt.shape[1]
        rows = seq.shape[0] - start + 1
        with torch.no_grad(), capture_selected_attention(model, capture, last_rows=rows):
            out = model(
                seq[None],
                output_hidden_states=True,
                output_attentions=True,
                use_cache=False,
                logits_to_keep=1,
            )
        unit = [torch.nn.functional.normalize(h[0].float(), dim=-1) for h in out.hidden_states]
        weights = [a for a in out.attentions if a is not None]
        by_head = {
            (layer, int(head)): w[0, i, -rows:].float()
            for layer, w in zip(sorted(capture), weights)
            for i, head in enumerate(capture[layer])
        }
        samples.append((seq, start, unit, torch.stack([by_head[h] for h in ranked])))
        print(f"prompt {row['id']}: {start} prompt tokens, {seq.shape[0] - start} new", flush=True)

    times = forward_times(model, samples[0][0][: samples[0][1]], [1, 2, 4, 8, 16, 32, 64])
    print("target forward times (ms): " + ", ".join(f"q={q}: {t * 1000:.1f}" for q, t in times.items()))

    def evaluate(make_rank: Callable, k: int, max_k: int | None = None) -> tuple[float, float]:
        new = fwd = 0
        cost = base = 0.0
        for seq, start, unit, att in samples:
            r = replay(
                seq, start, make_rank(unit, att, start - 1), k, eos, start + args.max_new_tokens, max_k
            )
            new += r.new_tokens
            fwd += r.forwards
            cost += sum(interpolate(times, q) for q in r.verify_sizes[1:])
            base += (r.new_tokens - 1) * times[1]
        return new / fwd, base / cost

    lines = ["| setting | K | tau | est. speedup vs ar |", "|---|---:|---:|---:|"]

    def row(name: str, k: int, make_rank: Callable, max_k: int | None = None) -> tuple[float, float]:
        tau, speed = evaluate(make_rank, k, max_k)
        ks_text = f"{k}" if not max_k or max_k == k else f"{k} (grows to {max_k})"
        lines.append(f"| {name} | {ks_text} | {tau:.2f} | {speed:.2f}x |")
        return tau, speed

    row("hf-pld (2-gram, first match)", 10, lambda u, a, o: hf_pld_rank(2))
    taus = {
        layer: row(f"PLD+(h) l={layer}", args.sweep_k, lambda u, a, o, la=layer: hidden_rank(u[la]))[0]
        for layer in layers
    }
    layer = max(taus, key=taus.get)
    best = {}
    for theta in h_thresholds:
        for k in ks:
            best[(theta, k)] = row(
                f"PLD+(h) l={layer}, min_score={theta}",
                k,
                lambda u, a, o, th=theta: hidden_rank(u[layer], th),
            )[1]
    theta_h, k_h = max(best, key=best.get)
    growth = {k_h: best[(theta_h, k_h)]}
    for max_k in max_ks:
        if max_k > k_h:
            growth[max_k] = row(
                f"PLD+(h) l={layer}, min_score={theta_h}",
                k_h,
                lambda u, a, o: hidden_rank(u[layer], theta_h),
                max_k,
            )[1]
    max_k_h = max(growth, key=growth.get)
    taus = {
        top: row(f"PLD+(a) top {top} heads", args.sweep_k, lambda u, a, o, t=top: attention_rank(a[:t], o))[0]
        for top in tops
    }
    top = max(taus, key=taus.get)
    best = {}
    for theta in a_thresholds:
        for k in ks:
            best[(theta, k)] = row(
                f"PLD+(a) top {top} heads, min_score={theta}",
                k,
                lambda u, a, o, th=theta: attention_rank(a[:top], o, th),
            )[1]
    theta_a, k_a = max(best, key=best.get)
    growth = {k_a: best[(theta_a, k_a)]}
    for max_k in max_ks:
        if max_k > k_a:
            growth[max_k] = row(
                f"PLD+(a) top {top} heads, min_score={theta_a}",
                k_a,
                lambda u, a, o: attention_rank(a[:top], o, theta_a),
                max_k,
            )[1]
    max_k_a = max(growth, key=growth.get)
    print("\n".join(lines))
    print(
        f"best by tau (K={args.sweep_k}): layer {layer}, top {top} heads; best by est. speedup: "
        f"PLD+(h) min_score={theta_h} K={k_h} growing to {max_k_h}; "
        f"PLD+(a) min_score={theta_a} K={k_a} growing to {max_k_a}"
    )
    return 0
