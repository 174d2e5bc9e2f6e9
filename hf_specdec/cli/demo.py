"""``hf-specdec demo``: plain greedy ``generate`` next to the fastest method we have, on two prompts.

Methods are set up as the bench sets them up (``bench/own_models.py``): ``ar`` runs ``--model`` (else the default
target); ``--method space`` without a SAR-SFT ``--model`` decodes the shipped SAR-SFT model, so its tokens are
checked against plain ``generate`` of that model, and its speedup is over ``ar`` on the target."""

from __future__ import annotations

import textwrap

import torch

from ..core.timing import clock
from ..kernels import KERNELS
from ..options import add_model_arguments

# Fastest first; the first one that is available is shown.
PREFERENCE = ["pld-plus-h", "pld-plus-a", "hf-pld"]


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="generate with plain greedy and the fastest method, side by side")
    add_model_arguments(p, "--model", "any HF causal LM")
    p.add_argument(
        "--dtype",
        choices=["fp32", "bf16", "auto"],
        default="fp32",
        help="auto: bf16 only where the CPU runs it natively",
    )
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument(
        "--kernels",
        choices=list(KERNELS),
        default="stock",
        help="linear-layer kernels of every model (hf_specdec.apply_kernels): stock, or onednn (CPU prepacked)",
    )
    p.add_argument(
        "--method", default=None, help="method to compare with plain generate (default: fastest available)"
    )
    p.set_defaults(func=run)


def _columns(left: str, right: str, width: int = 58) -> str:
    a = [line for para in left.splitlines() for line in (textwrap.wrap(para, width) or [""])]
    b = [line for para in right.splitlines() for line in (textwrap.wrap(para, width) or [""])]
    n = max(len(a), len(b))
    a, b = a + [""] * (n - len(a)), b + [""] * (n - len(b))
    return "\n".join(f"{x:<{width}} | {y}" for x, y in zip(a, b))


def run(args) -> int:
    from ..bench.methods import BenchContext, available_methods, get_method
    from ..bench.own_models import OwnModels, setup_runners
    from ..machine import describe_machine, machine_line, resolve_auto_dtype
    from ..space.adapter import load_model
    from ..tasks import load_task

    args.dtype = resolve_auto_dtype(args.dtype)

    methods = available_methods()
    name = args.method or next(m for m in PREFERENCE if m in methods)
    classes = [get_method(n) for n in dict.fromkeys(["ar", name])]  # an unknown name fails before loading
    model, tokenizer = load_model(args.model, args.dtype, gguf_file=args.gguf_file)
    ctx = BenchContext(model, tokenizer, args.dtype, model_name=args.model)
    runners = setup_runners([c.name for c in classes], classes, ctx)
    if args.kernels != "stock":
        from ..bench.kernel_runs import apply_run_kernels

        for what, report in apply_run_kernels(runners, model, args.kernels).items():
            print(f"{what}: {report}")
    own = OwnModels(runners, model, ctx)
    prompts = [load_task("code-edit", tokenizer, 3)[2], load_task("text-edit", tokenizer, 1)[0]]
    for r in runners.values():  # warm-up
        r.generate(tokenizer(prompts[0]["prompt"], return_tensors="pt").input_ids.to(model.device), 4)
    totals = {n: [0, 0.0] for n in runners}
    for row in prompts:
        ids = tokenizer(row["prompt"], return_tensors="pt").input_ids.to(model.device)
        out = {}
        for n, r in runners.items():
            t0 = clock(model.device)
            with torch.no_grad():
                tokens, _ = r.generate(ids, args.max_new_tokens)
            dt = clock(model.device) - t0
            out[n] = (tokens.tolist(), dt)
            totals[n][0] += len(tokens)
            totals[n][1] += dt
        print("=" * 120)
        print(f"prompt {row['id']}: {row['source'][:100]!r}...")
        print("-" * 120)
        heads = {
            n: f"{n}: {len(t)} tokens in {dt:.2f}s = {len(t) / dt:.1f} tok/s" for n, (t, dt) in out.items()
        }
        print(_columns(heads["ar"], heads[name]))
        print("-" * 120)
        print(
            _columns(
                tokenizer.decode(out["ar"][0], skip_special_tokens=True),
                tokenizer.decode(out[name][0], skip_special_tokens=True),
            )
        )
        if name in own:  # its own model: the reference is plain generate of that model
            same = out[name][0] == own.reference(name, ids, args.max_new_tokens)
            print(
                f"\nidentical tokens to plain generate of {own.sources[name]} (what {name} decodes): {same}"
            )
        else:
            print(f"\nidentical tokens: {out['ar'][0] == out[name][0]}")
    ar_tps = totals["ar"][0] / totals["ar"][1]
    m_tps = totals[name][0] / totals[name][1]
    print("=" * 120)
    print(
        f"ar: {ar_tps:.1f} tok/s   {name}: {m_tps:.1f} tok/s   speedup {m_tps / ar_tps:.2f}x  "
        f"({args.dtype}; {machine_line(describe_machine(model.device))})"
    )
    print(
        "Full benchmark: .venv/bin/hf-specdec bench --methods ar,hf-pld --tasks code-edit,mt-bench --limit 10 --out bench-out  (or `make bench`)"
    )
    return 0
