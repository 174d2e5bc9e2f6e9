"""``hf-specdec bench``."""

from __future__ import annotations

import argparse

from ..errors import SpecDecError
from ..kernels import KERNELS
from ..options import TIE_TOL_BY_DTYPE, add_model_arguments


def _csv(value: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items:
        raise argparse.ArgumentTypeError("expected a comma-separated list")
    return items


def add_parser(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="benchmark methods side by side with plain generate",
        description="Spec-Bench-style benchmark: methods interleaved per prompt in one process; writes "
        "OUT/results.json, OUT/report.md and OUT/speedup.png. `ar` (plain greedy generate) is always run as the reference.",
    )
    p.add_argument(
        "--methods",
        type=_csv,
        default=["ar", "hf-pld"],
        help="comma-separated method names (default: ar,hf-pld)",
    )
    p.add_argument("--tasks", type=_csv, default=["code-edit", "mt-bench"], help="comma-separated task names")
    p.add_argument("--limit", type=int, default=10, help="prompts per task (default 10)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument(
        "--batch-size",
        type=int,
        default=1,
        help="prompts per batch (default 1); B > 1: each task's prompts in left-padded batches of B, tokens/s over "
        "all rows, the reference is plain batched generate at the same B; a method that does not batch (hf-pld) "
        "runs the rows one at a time",
    )
    p.add_argument(
        "--check-rows",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="at --batch-size > 1, also run plain generate on every row alone (untimed) and compare each row with "
        "it (default: on when B > 1)",
    )
    p.add_argument(
        "--dtype",
        choices=["fp32", "bf16", "fp16", "auto"],
        default="fp32",
        help="auto: bf16 where the CPU has native bf16 (AVX512-BF16 / AMX) or on a GPU, else fp32",
    )
    add_model_arguments(p, "--model", "any HF causal LM")
    p.add_argument(
        "--tie-tol",
        type=float,
        default=None,
        help=f"logit gap that counts as a near-tie in bf16/fp16 (default by dtype: bf16 {TIE_TOL_BY_DTYPE['bf16']}, "
        f"fp16 {TIE_TOL_BY_DTYPE['fp16']}; at least two units of the dtype at the top logit)",
    )
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=(
            "method option, e.g. --option glide=PATH, --option edd=PATH, --option gamma=3 "
            "(repeatable; a key no method reads is an error)"
        ),
    )
    p.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="sample at this temperature (top-k/top-p off; batch 1; seeded per prompt with --seed) instead of greedy: "
        "speed and tau under sampling, whose losslessness the distribution tests check",
    )
    p.add_argument(
        "--kernels",
        choices=list(KERNELS),
        default="stock",
        help="the linear-layer kernels every model of the run uses (hf_specdec.apply_kernels): stock (PyTorch's "
        "default) or onednn (weights prepacked for oneDNN, CPU); with onednn the run also times `ar-stock`, plain "
        "generate of a second copy of the target on stock kernels, and reports speedups over it",
    )
    p.add_argument(
        "--cold",
        action="store_true",
        help="no warm-up generation: each method's first timed call is its first call in this process (what a "
        "script that makes one call sees; one plain forward runs first, so torch's own first-call set-up is "
        "nobody's); the report adds each method's speedup on the first prompt",
    )
    p.add_argument("--seed", type=int, default=0, help="with --temperature: prompt i is seeded with seed + i")
    p.add_argument("--out", default="bench-out", help="output folder")
    p.add_argument("--list", action="store_true", help="list the available methods and tasks, then exit")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..tasks import task_names
    from .methods import available_methods

    if args.list:
        for name, cls in available_methods().items():
            print(f"method  {name:16s} {cls.description}")
        for name in task_names():
            print(f"task    {name}")
        return 0
    options = {}
    for item in args.option:
        if "=" not in item:
            raise SpecDecError(f"--option {item!r}: expected KEY=VALUE")
        key, value = item.split("=", 1)
        options[key.strip()] = value
    from .harness import run_bench

    results = run_bench(
        args.methods,
        args.tasks,
        limit=args.limit,
        max_new_tokens=args.max_new_tokens,
        dtype=args.dtype,
        out=args.out,
        model=args.model,
        gguf_file=args.gguf_file,
        tie_tol=args.tie_tol,
        options=options,
        command=args.command_line,
        batch_size=args.batch_size,
        check_rows=args.check_rows,
        temperature=args.temperature,
        seed=args.seed,
        kernels=args.kernels,
        cold=args.cold,
    )
    from .report import report_markdown

    print(report_markdown(results))
    print(f"wrote {args.out}/results.json, {args.out}/report.md, {args.out}/speedup.png")
    # ar-stock is plain generate on other kernels: shown against ar, not a method whose losslessness is judged
    # a sampled run's losslessness (None) is the distribution tests'; nothing of it failed here
    judged = [
        r["lossless"] for r in results["runs"] if r["method"] != "ar-stock" and r["lossless"] is not None
    ]
    return 0 if all(judged) else 1
