"""``hf-specdec corpus``: the command line of both corpora (docs/corpus.md).

Without ``--regenerate`` it tokenizes ShareGPT once into ``--out`` (``data/tokenized.py``'s ``build_corpus``); with
it, the target answers ShareGPT's prompts itself (``regenerate.py``), ``--finalize`` assembles the shards written so
far (``dataset.py``) and ``--measure`` times methods and batch sizes (``measure.py``).
"""

from __future__ import annotations

import torch

from hf_specdec.errors import SpecDecError
from hf_specdec.options import add_model_arguments

from ..data.tokenized import build_corpus
from .regenerate import DEFAULT_BATCH_SIZE, DEFAULT_METHOD, METHODS, regenerate


def add_parser(sub) -> None:
    p = sub.add_parser(
        "corpus",
        help="tokenize ShareGPT once for drafter training (`hf-specdec train ... --corpus DIR`); with --regenerate, "
        "the target's own answers to ShareGPT's prompts",
    )
    p.add_argument("--out", required=True, help="folder to write corpus.json and {split}.safetensors into")
    add_model_arguments(
        p,
        "--model",
        "the target whose tokenizer to use (and, with --regenerate, who answers)",
        deprecated=("--target",),
    )
    p.add_argument(
        "--limit-conversations", "--limit", type=int, default=None, help="first N per split (tests)"
    )
    add_regenerate_arguments(p)
    p.set_defaults(func=_run)


def _run(args) -> int:
    from hf_specdec.target import load_tokenizer

    if args.regenerate or args.finalize or args.measure:
        return run_regenerate(args)
    build_corpus(
        load_tokenizer(args.model, gguf_file=args.gguf_file),
        args.out,
        limit_conversations=args.limit_conversations,
    )
    return 0


def add_regenerate_arguments(p) -> None:
    """``hf-specdec corpus``'s options for ``--regenerate`` (see :func:`add_parser`)."""
    g = p.add_argument_group("--regenerate (the target answers ShareGPT's prompts; docs/corpus.md)")
    g.add_argument(
        "--regenerate",
        action="store_true",
        help="write the target's own answers to ShareGPT's prompts (a datasets dataset + the token corpus)",
    )
    g.add_argument("--splits", default="validation,train", help="comma-separated, in this order")
    g.add_argument("--max-new-tokens", type=int, default=256, help="per answer")
    g.add_argument("--max-turns", type=int, default=3, help="user turns answered per conversation")
    g.add_argument(
        "--max-prompt-tokens",
        type=int,
        default=1024,
        help="a conversation ends before a turn whose prompt is longer",
    )
    g.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE)
    g.add_argument(
        "--method",
        choices=METHODS,
        default=DEFAULT_METHOD,
        help="ar: batched generate; pld-plus-h: PLD+(h) (lossless); ar-refill: greedy with a refilled batch "
        "(continuous batching: a finished row's place goes to the next prompt)",
    )
    g.add_argument("--dtype", choices=["auto", "fp32", "bf16"], default="auto", help="the target's dtype")
    g.add_argument(
        "--sample",
        action="store_true",
        help="sample at the target's generation config temperature / top-k / top-p (default: greedy)",
    )
    g.add_argument("--seed", type=int, default=0, help="--sample's seed (each batch seeds from it)")
    g.add_argument(
        "--shard-size", type=int, default=64, help="conversations per shard (the unit of resuming)"
    )
    g.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    g.add_argument(
        "--finalize",
        action="store_true",
        help="only assemble the shards written so far into the dataset and the token corpus",
    )
    g.add_argument(
        "--measure",
        default=None,
        metavar="METHOD:B,...",
        help="time these (method, batch size) pairs on --measure-prompts prompts instead (e.g. ar:8,pld-plus-h:4)",
    )
    g.add_argument("--measure-prompts", type=int, default=16)
    g.add_argument(
        "--measure-shards",
        default=None,
        metavar="N,...",
        help="with --measure: time these whole shards of the run in --out (its settings; first of --splits) instead",
    )


def run_regenerate(args) -> int:
    """``hf-specdec corpus --regenerate`` (or ``--finalize``, ``--measure``)."""
    from hf_specdec.machine import resolve_auto_dtype
    from hf_specdec.target import load_target

    from .dataset import finalize
    from .measure import measure, measure_shards

    if args.measure_shards and not args.measure:
        raise SpecDecError("--measure-shards times the configurations of --measure METHOD:B,...; pass both")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.finalize:
        tokenizer = None
        if args.model or args.gguf_file:
            from hf_specdec.target import load_tokenizer

            tokenizer = load_tokenizer(args.model, gguf_file=args.gguf_file)
        finalize(args.out, tokenizer)
        return 0
    dtype = resolve_auto_dtype(args.dtype)
    model, tokenizer = load_target(args.model, dtype, gguf_file=args.gguf_file)
    if torch.cuda.is_available():
        model.to("cuda")
    if args.measure:
        configs = []
        for item in args.measure.split(","):
            method, _, b = item.partition(":")
            if method not in METHODS or not b.isdigit():
                raise SpecDecError(
                    f"--measure {item!r}: expected METHOD:B with METHOD in {', '.join(METHODS)}"
                )
            configs.append((method, int(b)))
        if args.measure_shards:
            split = args.splits.split(",")[0].strip()
            try:
                shards = [int(s) for s in args.measure_shards.split(",")]
            except ValueError:
                raise SpecDecError(
                    f"--measure-shards {args.measure_shards!r}: expected shard numbers, e.g. 30,35"
                ) from None
            measure_shards(model, tokenizer, args.out, split, shards, configs, dtype)
            return 0
        measure(model, tokenizer, configs, args.measure_prompts, args.max_new_tokens, args.max_prompt_tokens)
        return 0
    splits = [s.strip() for s in args.splits.split(",") if s.strip()]
    if not splits or any(s not in ("train", "validation") for s in splits):
        raise SpecDecError(f"--splits {args.splits!r}: use train and/or validation")
    regenerate(
        model,
        tokenizer,
        args.out,
        splits=splits,
        limit=args.limit_conversations,
        max_new_tokens=args.max_new_tokens,
        max_turns=args.max_turns,
        max_prompt_tokens=args.max_prompt_tokens,
        batch_size=args.batch_size,
        method=args.method,
        sample=args.sample,
        seed=args.seed,
        shard_size=args.shard_size,
        dtype=dtype,
        command=getattr(args, "command_line", None),
    )
    return 0
