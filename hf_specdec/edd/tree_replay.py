"""``hf-specdec tree-replay``: tau and tree size of EDD's candidate trees (PCT, VCT, EAGLE-2, chain) by greedy replay.

Greedy tree verification accepts the longest tree path that equals the target's own greedy continuation
(``hf_specdec/core/acceptance.py``), so a greedy tree-decoding run is fixed by the plain greedy output. This command
generates that output once per prompt, takes the target's hidden states of prompt + output from one forward (EDD's
soft prompt), and replays each tree builder step by step: the drafter runs exactly as in ``tree_generate``, the
target does not. tau (tokens per target forward) and nodes per step therefore match ``hf-specdec bench`` up to
float noise between one full forward and incremental ones, at a fraction of the cost (a VCT step verifies 363
nodes; replaying it costs five drafter forwards), so many more prompts fit in the same time. PCT's s_d/s_t is
fixed for the replay (``--ratio``, default: the proposer's own calibration on this machine). Speed is not
estimated here; measure it with ``hf-specdec bench``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch

from ..core.tree import ROOT
from ..errors import SpecDecError
from ..options import add_model_arguments
from .draft_state import EddDraftState
from .pct import GrownTree


@dataclass
class TreeReplay:
    """Totals of one builder over replayed generations."""

    new_tokens: int = 0
    forwards: int = 0  # target forwards, the prefill included (as ``DecodeStats``)
    nodes: int = 0  # draft nodes verified, summed over drafting steps

    @property
    def tau(self) -> float:
        return self.new_tokens / self.forwards if self.forwards else 0.0

    @property
    def nodes_per_step(self) -> float:
        """Verified draft nodes per target forward (the prefill counted, as in the bench tables)."""
        return self.nodes / self.forwards if self.forwards else 0.0

    def add(self, other: TreeReplay) -> None:
        self.new_tokens += other.new_tokens
        self.forwards += other.forwards
        self.nodes += other.nodes


def accepted_length(tree: GrownTree, continuation: list[int]) -> int:
    """Depth of the longest root path of ``tree`` whose tokens are a prefix of ``continuation`` (greedy acceptance)."""
    children: dict[int, list[int]] = {}
    for i, parent in enumerate(tree.parents):
        children.setdefault(parent, []).append(i)
    node, depth = ROOT, 0
    while depth < len(continuation):
        match = [c for c in children.get(node, []) if tree.tokens[c] == continuation[depth]]
        if not match:
            break
        node, depth = match[0], depth + 1
    return depth


@torch.no_grad()
def replay_tree(
    proposer, sequence: torch.Tensor, start: int, hidden: torch.Tensor, max_length: int
) -> TreeReplay:
    """Replay greedy ``tree_generate`` with ``proposer`` (an ``EddTreeProposer``) on the greedy output ``sequence``
    (1-D, prompt of ``start`` tokens first); ``hidden`` (1, len, D) are the target's encoder-layer states of it."""
    total = sequence.shape[0]
    if not start < total <= max_length:
        raise SpecDecError(
            f"replay needs prompt length < output length <= max_length (got {start}, {total}, {max_length})"
        )
    edd = proposer.edd
    state = EddDraftState(edd)
    if state.soft_prompt:
        state.push_hidden(hidden[:, :start])
    ids = sequence[None]
    n, out = start + 1, TreeReplay(new_tokens=1, forwards=1)  # the prefill emits token `start`
    while n < total:
        depth = min(proposer.depth, max_length - n - 1)
        tree = proposer.grow(proposer.expander(state, ids[:, :n]), depth) if depth > 0 else GrownTree()
        accepted = accepted_length(tree, sequence[n:].tolist())
        emitted = min(accepted + 1, total - n)  # the accepted path and the target's bonus token
        if state.soft_prompt:
            state.push_hidden(hidden[:, n - 1 : n - 1 + emitted])
        n += emitted
        out.new_tokens += emitted
        out.forwards += 1
        out.nodes += len(tree)
    return out


def _builders(args) -> list[tuple[str, dict]]:
    from ..options import parse_floats, parse_ints

    rows = []
    for name in args.builders.split(","):
        name = name.strip()
        if name == "pct":
            temperatures = parse_floats(args.temperatures) if args.temperatures else [None]
            for removal in parse_floats(args.removals):
                for width in parse_ints(args.widths):
                    for t in temperatures:
                        label = f"pct w{width} r{removal:g}" + ("" if t is None else f" T{t:g}")
                        kw = dict(width=width, removal_threshold=removal, confidence_temperature=t)
                        rows.append((label, kw))
        elif name:
            rows.append((name, {}))
    return rows


def add_parser(sub) -> None:
    p = sub.add_parser(
        "tree-replay",
        help="tau and nodes per step of EDD's candidate trees (pct, vct, eagle2, chain) by exact greedy replay",
        description=__doc__.split("\n\n")[1],
    )
    p.add_argument(
        "--drafter",
        default=None,
        help="EDD checkpoint (default: as the bench: runs/edd-smollm2, else shipped)",
    )
    add_model_arguments(p, "--model", "the target")
    p.add_argument("--tasks", default="mt-bench,humaneval,summarize")
    p.add_argument("--limit", type=int, default=10, help="prompts per task")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--builders", default="chain,pct,vct,eagle2", help="comma list of pct, vct, eagle2, chain")
    p.add_argument("--removals", default="0.01", help="PCT removal thresholds to try (App. B: 0.01)")
    p.add_argument("--widths", default="5", help="PCT expansion widths to try (App. B: 5)")
    p.add_argument(
        "--temperatures",
        default=None,
        help="PCT confidence temperatures to try (default: the drafter's calibrated one; 1 = raw softmax)",
    )
    p.add_argument(
        "--ratio", type=float, default=None, help="PCT's s_d/s_t (default: calibrated on this machine)"
    )
    p.add_argument("--out", default=None, help="also write the table as JSON here")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..modeling import EddForCausalLM
    from ..target import greedy_output, load_target
    from ..tasks import load_task
    from .checkpoint import find_edd_checkpoint
    from .tree_proposer import EddTreeProposer

    builders = _builders(args)  # bad lists and unknown builders fail before anything loads
    for name, kw in builders:
        EddTreeProposer(None, name.split()[0], **kw)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    for task in tasks:
        load_task(task, None, args.limit)
    model, tokenizer = load_target(args.model, "fp32", gguf_file=args.gguf_file)
    edd = EddForCausalLM.from_pretrained(find_edd_checkpoint(args.drafter, model), target=model).eval()
    data = {t: load_task(t, tokenizer, args.limit) for t in tasks}
    proposers = {name: EddTreeProposer(edd, name.split()[0], **kw) for name, kw in builders}
    ratio = args.ratio
    if ratio is None:
        probe = EddTreeProposer(edd, "pct")
        probe.calibrate(model, tokenizer(data[tasks[0]][0]["prompt"], return_tensors="pt").input_ids)
        ratio = probe.timer.ratio
    for proposer in proposers.values():
        proposer.timer.fixed_ratio = ratio
    print(f"s_d/s_t for PCT: {ratio:.4f}", flush=True)

    table: dict[str, dict[str, TreeReplay]] = {}
    for task, ds in data.items():
        for row in ds:
            prompt = tokenizer(row["prompt"], return_tensors="pt").input_ids
            seq = greedy_output(model, prompt, args.max_new_tokens)
            with torch.no_grad():
                hidden = model(seq[None], output_hidden_states=True, logits_to_keep=1).hidden_states
            states = hidden[edd.config.encoder_layer]
            start = prompt.shape[1]
            for name, proposer in proposers.items():
                result = replay_tree(proposer, seq, start, states, start + args.max_new_tokens)
                table.setdefault(task, {}).setdefault(name, TreeReplay()).add(result)
            print(f"{row['id']}: {seq.shape[0] - start} new tokens", flush=True)

    print(f"\n{'task':<11} {'builder':<16} {'tau':>6} {'nodes/step':>11}")
    for task, rows in table.items():
        for name, r in rows.items():
            print(f"{task:<11} {name:<16} {r.tau:>6.3f} {r.nodes_per_step:>11.1f}")
    if args.out:
        report = {
            "command": getattr(args, "command_line", None),
            "ratio": ratio,
            "results": {
                t: {
                    n: dict(
                        tau=r.tau,
                        nodes_per_step=r.nodes_per_step,
                        new_tokens=r.new_tokens,
                        forwards=r.forwards,
                    )
                    for n, r in rows.items()
                }
                for t, rows in table.items()
            },
        }
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return 0
