"""``hf-specdec pld-tune``: PLD+'s hyper-parameters (K, layer l, number of heads) on one task (PLD+, arXiv:2412.01447, §5.5).

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

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..core.generate_io import eos_token_ids
from ..core.verify_cost import CostCurve, forward_times, interpolate
from ..options import add_model_arguments, parse_floats, parse_ints
from .defaults import DEFAULT_PRIORS
from .draft_length import DraftLength
from .ranking import occurrences, rank_by_attention, rank_by_hidden

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
    seq: torch.Tensor,
    start: int,
    rank: Ranker,
    k: int,
    eos: set[int],
    max_len: int,
    cost: CostCurve | None = None,
    priors: tuple[float, float, float] = DEFAULT_PRIORS,
) -> Replay:
    """Replay one greedy PLD-style generation of ``seq[start:]``; ``rank(ids)`` returns the draft's source ``j``
    (the draft is ``ids[j+1 : j+1+K]``, ``K`` from :class:`DraftLength`: fixed ``k``, or adaptive up to ``k``
    with ``cost``) or ``None``."""
    n, total = start + 1, seq.shape[0]  # the prefill produced token `start`
    sizes = [start]
    lengths = DraftLength(k, cost, *priors)
    while n < total:
        ids = seq[:n]
        budget = max_len - n - 1
        j = rank(ids) if budget > 0 else None
        size = 0 if j is None else lengths.for_source(j, budget)
        draft = seq[j + 1 : min(j + 1 + size, n)].tolist() if size else []
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


def oracle_rank(seq: torch.Tensor, k: int) -> Ranker:
    """The bound of every ranking: the occurrence whose next ``k`` tokens the target would accept the most of
    (it reads the greedy output, so only a replay can use it)."""

    def rank(ids: torch.Tensor) -> int | None:
        n = ids.shape[0]
        best, best_len = None, -1
        for j in occurrences(ids).tolist():
            length = 0
            while length < k and j + 1 + length < n and n + length < seq.shape[0]:
                if int(seq[j + 1 + length]) != int(seq[n + length]):
                    break
                length += 1
            if length > best_len:
                best, best_len = j, length
        return best

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
    add_model_arguments(p, "--model", "the target")
    p.add_argument("--layers", default="all", help="hidden-state indices to sweep, or 'all' (default)")
    p.add_argument("--sweep-k", type=int, default=10, help="K while sweeping layers / heads (paper: 10)")
    p.add_argument("--ks", default="5,8,10,12,16,20,30", help="K values tried at the chosen layer / heads")
    p.add_argument("--max-k", type=int, default=64, help="adaptive K's cap (pld_max_num_tokens)")
    p.add_argument(
        "--fresh-priors", default="0.2,0.4,0.6", help="adaptive K: fresh-occurrence hit-rate priors"
    )
    p.add_argument("--run-priors", default="0.8,0.9", help="adaptive K: running-copy hit-rate priors")
    p.add_argument("--cont-priors", default="0.8,0.85,0.9,0.95", help="adaptive K: continuation-rate priors")
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
    from ..target import greedy_output, load_target
    from ..tasks import load_task
    from .attention_capture import capture_selected_attention
    from .heads_file import default_heads_file, read_heads_file

    model, tokenizer = load_target(args.model, args.dtype, gguf_file=args.gguf_file)
    ds = load_task(args.task, tokenizer, args.limit)
    eos = set(eos_token_ids(model.generation_config))
    n_layers = model.config.num_hidden_layers
    layers = list(range(n_layers + 1)) if args.layers == "all" else parse_ints(args.layers)
    ks, tops = parse_ints(args.ks), parse_ints(args.top_heads)
    fresh_priors, run_priors = parse_floats(args.fresh_priors), parse_floats(args.run_priors)
    cont_priors = parse_floats(args.cont_priors)
    h_thresholds, a_thresholds = parse_floats(args.h_thresholds), parse_floats(args.a_thresholds)
    ranked = read_heads_file(args.heads or default_heads_file(model), model=model, top=max(tops))
    capture = {}
    for layer, head in ranked:
        capture.setdefault(layer, []).append(head)
    capture = {layer: torch.tensor(sorted(hs), device=model.device) for layer, hs in capture.items()}

    samples = []  # (seq, start, unit hidden states per layer, (heads, rows, keys) attention in ranked order)
    for row in ds:
        prompt = tokenizer(row["prompt"], return_tensors="pt").input_ids
        seq = greedy_output(model, prompt, args.max_new_tokens)
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

    cost = CostCurve(times)

    def evaluate(make_rank: Callable, k: int, adaptive: tuple[float, float] | None) -> tuple[float, float]:
        new = fwd = 0
        spent = base = 0.0
        for seq, start, unit, att in samples:
            extra = {} if adaptive is None else {"cost": cost, "priors": adaptive}
            rank = oracle_rank(seq, k) if make_rank is oracle_rank else make_rank(unit, att, start - 1)
            r = replay(seq, start, rank, k, eos, start + args.max_new_tokens, **extra)
            new += r.new_tokens
            fwd += r.forwards
            spent += sum(interpolate(times, q) for q in r.verify_sizes[1:])
            base += (r.new_tokens - 1) * times[1]
        return new / fwd, base / spent

    lines = ["| setting | K | tau | est. speedup vs ar |", "|---|---:|---:|---:|"]

    def row(name: str, k: int, make_rank: Callable, adaptive=None) -> tuple[float, float]:
        tau, speed = evaluate(make_rank, k, adaptive)
        k_text = f"{k}" if adaptive is None else f"adaptive <= {k}, priors {'/'.join(map(str, adaptive))}"
        lines.append(f"| {name} | {k_text} | {tau:.2f} | {speed:.2f}x |")
        return tau, speed

    def tune(name: str, make_rank: Callable, thresholds: list[float]) -> tuple[float, int, tuple]:
        """Fixed K x threshold (the paper's grid), then adaptive K's priors at the best threshold."""
        fixed = {
            (theta, k): row(
                f"{name}, min_score={theta}", k, lambda u, a, o, th=theta: make_rank(u, a, o, th)
            )[1]
            for theta in thresholds
            for k in ks
        }
        theta, k = max(fixed, key=fixed.get)
        adaptive = {
            (pf, pr, pc): row(
                f"{name}, min_score={theta}",
                args.max_k,
                lambda u, a, o: make_rank(u, a, o, theta),
                (pf, pr, pc),
            )[1]
            for pf in fresh_priors
            for pr in run_priors
            for pc in cont_priors
        }
        priors = max(adaptive, key=adaptive.get)
        return theta, k, priors

    row("hf-pld (2-gram, first match)", 10, lambda u, a, o: hf_pld_rank(2))
    for k in ks:
        row("oracle occurrence (bound of any ranking)", k, oracle_rank)
    taus = {
        layer: row(f"PLD+(h) l={layer}", args.sweep_k, lambda u, a, o, la=layer: hidden_rank(u[la]))[0]
        for layer in layers
    }
    layer = max(taus, key=taus.get)
    theta_h, k_h, priors_h = tune(
        f"PLD+(h) l={layer}", lambda u, a, o, th: hidden_rank(u[layer], th), h_thresholds
    )
    taus = {
        top: row(f"PLD+(a) top {top} heads", args.sweep_k, lambda u, a, o, t=top: attention_rank(a[:t], o))[0]
        for top in tops
    }
    top = max(taus, key=taus.get)
    theta_a, k_a, priors_a = tune(
        f"PLD+(a) top {top} heads", lambda u, a, o, th: attention_rank(a[:top], o, th), a_thresholds
    )
    print("\n".join(lines))
    print(
        f"best by tau (K={args.sweep_k}): layer {layer}, top {top} heads; best by est. speedup: "
        f"PLD+(h) min_score={theta_h}, fixed K={k_h}, adaptive priors {priors_h}; "
        f"PLD+(a) min_score={theta_a}, fixed K={k_a}, adaptive priors {priors_a}"
    )
    return 0
