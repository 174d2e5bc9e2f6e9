"""A feature store: the frozen target run once over the training corpus, keeping exactly what the drafter reads.

On a CPU, a drafter training step is mostly the frozen target's forward (135M parameters against the drafter's
few million). ``hf-specdec features --kind edd|glide --corpus DIR --out DIR`` runs that forward once per block and
keeps what the drafter reads from it, as ``drafter.features_from_target`` defines it (EDD: the hidden states of
``encoder_layer``, its soft prompt; GLIDE: the cached keys / values of the layers it reads; the vanilla drafter:
nothing), plus the teacher: the target's top-k next tokens and their log-probabilities per position (a full
49k-row distribution per token would not fit; the KL is then taken against the renormalised top-k,
``trainers/drafters/losses.py``'s ``top_k_kl_loss``, and a live run can use the same teacher with
``--teacher-top-k``). The target runs on ``--device`` (default: the CPU it is loaded on; ``--device cuda`` to use a
GPU), and ``build_features`` runs wherever the target it is given already is.

Shards of ``SHARD_BLOCKS`` blocks are written as safetensors (``shard-00000.safetensors``: ``input_ids``,
``labels``, ``feature.NAME``, ``teacher_ids``, ``teacher_logp``), each to a temporary name first, so an
interrupted run resumes at the first missing shard; ``features.json`` records the target's fingerprint, the drafter
settings the features depend on, the corpus's tokenizer, block size, top-k and dtype, and is checked on resume and
on load. Training reads the shards memory-mapped, row by row (``FeatureStore``, a ``torch`` ``Dataset``):
``hf-specdec train edd --features DIR``. Loading never runs code from the store.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from hf_specdec.errors import SpecDecError
from hf_specdec.options import add_model_arguments

from .losses import teacher_top_k

FEATURES_FORMAT = 1
SHARD_BLOCKS = 64
STORE_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _drafter_settings(drafter) -> dict:
    """The drafter settings its features depend on (a store fits a drafter whose settings are these)."""
    c = drafter.config
    keys = (
        ("soft_prompt", "encoder_layer")
        if hasattr(c, "encoder_layer")
        else ("cross_attention", "target_layers")
    )
    return {"model_type": c.model_type, **{k: getattr(c, k) for k in keys}}


def store_metadata(drafter, corpus_meta: dict, block_size: int, top_k: int, dtype: str) -> dict:
    return {
        "format": FEATURES_FORMAT,
        "target": dict(getattr(drafter.config, drafter.fingerprint_field)),
        "drafter": _drafter_settings(drafter),
        "corpus_tokenizer_sha1": corpus_meta.get("tokenizer_sha1"),
        "block_size": block_size,
        "top_k": top_k,
        "dtype": dtype,
        "shard_blocks": SHARD_BLOCKS,
    }


@torch.no_grad()
def build_features(
    target,
    drafter,
    corpus_dir: str | Path,
    out_dir: str | Path,
    block_size: int = 256,
    blocks: int | None = None,
    top_k: int = 32,
    dtype: str = "bf16",
    batch_size: int = 8,
    split: str = "train",
) -> dict:
    """Write (or resume) the feature store of ``drafter`` (attached to ``target``) over ``blocks`` blocks of the
    corpus's ``split``; returns ``features.json``'s dict (with ``blocks`` and the shard count)."""
    from safetensors.torch import save_file
    from tqdm.auto import tqdm

    from ..data.tokenized import load_corpus

    if dtype not in STORE_DTYPES:
        raise SpecDecError(f"--dtype {dtype!r}: use one of {', '.join(STORE_DTYPES)}")
    if not 1 <= top_k <= target.config.vocab_size:
        raise SpecDecError(f"--top-k must be in [1, {target.config.vocab_size}], got {top_k}")
    corpus_meta = (
        json.loads((Path(corpus_dir) / "corpus.json").read_text()) if Path(corpus_dir).is_dir() else {}
    )
    ids, labels = load_corpus(corpus_dir, split)
    available = len(ids) // block_size
    n = available if blocks is None else min(blocks, available)
    if n == 0:
        raise SpecDecError(f"--corpus {corpus_dir}: fewer than {block_size} tokens in split {split!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = {**store_metadata(drafter, corpus_meta, block_size, top_k, dtype), "split": split, "blocks": n}
    meta_path = out / "features.json"
    if meta_path.is_file():
        old = json.loads(meta_path.read_text())
        if {k: v for k, v in old.items() if k != "blocks"} != {
            k: v for k, v in meta.items() if k != "blocks"
        }:
            raise SpecDecError(
                f"{out} holds features made with other settings ({meta_path}); use another --out or delete it"
            )
        meta["blocks"] = max(n, old["blocks"])
    meta_path.write_text(json.dumps(meta, indent=1))
    cast = STORE_DTYPES[dtype]
    device = next(target.parameters()).device
    shards = math.ceil(meta["blocks"] / SHARD_BLOCKS)
    for s in tqdm(range(shards), desc="feature shards"):
        path = out / f"shard-{s:05d}.safetensors"
        rows = range(s * SHARD_BLOCKS, min((s + 1) * SHARD_BLOCKS, meta["blocks"]))
        if path.is_file():
            continue  # written by an earlier run (shards are renamed into place only when complete)
        parts: dict[str, list[torch.Tensor]] = {}
        for start in range(rows.start, rows.stop, batch_size):
            stop = min(start + batch_size, rows.stop)
            tok = torch.from_numpy(ids[start * block_size : stop * block_size]).view(-1, block_size)
            lab = torch.from_numpy(labels[start * block_size : stop * block_size]).view(-1, block_size)
            fwd = {
                "output_hidden_states": False,
                **(drafter.target_forward_kwargs() or {}),
            }  # a new cache each pass
            output = target.base_model(input_ids=tok.to(device), **fwd)
            logits = target.get_output_embeddings()(output.last_hidden_state[:, :-1])
            t_ids, t_logp = teacher_top_k(logits, top_k)
            batch = {
                "input_ids": tok.int(),
                "labels": lab.int(),
                "teacher_ids": t_ids.int().cpu(),
                "teacher_logp": t_logp.float().cpu(),
                **{f"feature.{k}": v.to(cast).cpu() for k, v in drafter.features_from_target(output).items()},
            }
            for k, v in batch.items():
                parts.setdefault(k, []).append(v)
        tmp = path.with_suffix(".tmp")
        save_file({k: torch.cat(v).contiguous() for k, v in parts.items()}, str(tmp))
        tmp.replace(path)
    meta["shards"] = shards
    return meta


class FeatureStore(torch.utils.data.Dataset):
    """The blocks of a feature store, read row by row from memory-mapped shards (``input_ids``, ``labels``,
    ``feature.NAME``, ``teacher_ids``, ``teacher_logp`` per row)."""

    def __init__(self, root: str | Path):
        from safetensors import safe_open

        self.root = Path(root)
        meta_path = self.root / "features.json"
        if not meta_path.is_file():
            raise SpecDecError(
                f"--features {self.root}: no features.json there; build a store with `hf-specdec features "
                f"--kind edd|glide --corpus DIR --out {self.root}`"
            )
        self.meta = json.loads(meta_path.read_text())
        if self.meta.get("format") != FEATURES_FORMAT:
            raise SpecDecError(
                f"--features {self.root}: format {self.meta.get('format')!r}; rebuild the store"
            )
        shards = math.ceil(self.meta["blocks"] / self.meta["shard_blocks"])
        self.files = []
        for s in range(shards):
            path = self.root / f"shard-{s:05d}.safetensors"
            if not path.is_file():
                raise SpecDecError(
                    f"--features {self.root}: {path.name} is missing (an interrupted build); run the same "
                    "`hf-specdec features` command again to finish it"
                )
            try:
                self.files.append(safe_open(str(path), framework="pt"))
            except Exception as exc:
                raise SpecDecError(
                    f"--features {self.root}: {path.name} is unreadable ({exc}); delete it and rerun "
                    "`hf-specdec features` to rewrite it"
                ) from None
        self.keys = list(self.files[0].keys()) if self.files else []

    def __len__(self) -> int:
        return self.meta["blocks"]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        f = self.files[i // self.meta["shard_blocks"]]
        row = i % self.meta["shard_blocks"]
        item = {k: f.get_slice(k)[row] for k in self.keys}
        item["input_ids"], item["labels"] = item["input_ids"].long(), item["labels"].long()
        return item

    def check(self, drafter, target=None) -> None:
        """Raise unless this store holds what ``drafter`` reads, computed by ``target`` (its fingerprint)."""
        want = _drafter_settings(drafter)
        have = self.meta["drafter"]
        if {k: (list(v) if isinstance(v, tuple) else v) for k, v in want.items()} != have:
            raise SpecDecError(
                f"--features {self.root} was made for a drafter with {have}, not {want}; build a store for this one"
            )
        if target is not None:
            from hf_specdec.target import check_fingerprint

            check_fingerprint(self.meta["target"], target, what=f"feature store {self.root}")


def add_parser(sub) -> None:
    p = sub.add_parser(
        "features",
        help="run the frozen target once over the corpus and keep what a drafter reads (train ... --features DIR)",
    )
    p.add_argument(
        "--kind", choices=["edd", "glide", "vanilla"], required=True, help="which drafter's features"
    )
    p.add_argument("--corpus", required=True, help="a token corpus from `hf-specdec corpus --out DIR`")
    p.add_argument("--out", required=True, help="the store's folder (an interrupted run resumes there)")
    add_model_arguments(p, "--model", "the target", deprecated=("--target",))
    p.add_argument("--block-size", type=int, default=256)
    p.add_argument("--blocks", type=int, default=None, help="how many blocks (default: the whole split)")
    p.add_argument("--top-k", type=int, default=32, help="teacher tokens kept per position")
    p.add_argument("--dtype", choices=list(STORE_DTYPES), default="bf16", help="dtype of the stored features")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--encoder-layer", type=int, default=None, help="EDD: target hidden_states index")
    p.add_argument("--target-layers", default=None, help="GLIDE: comma-separated target layers it reads")
    p.add_argument(
        "--device",
        default="cpu",
        help="where the target runs (e.g. cuda, cuda:1; default: cpu, where it is loaded)",
    )
    p.set_defaults(func=_run)


def drafter_for_kind(
    kind: str, target, encoder_layer: int | None = None, target_layers: list[int] | None = None
):
    """An (untrained) drafter of ``kind`` for ``target``: what defines which features it reads."""
    from hf_specdec.modeling import EddConfig, EddForCausalLM, GlideConfig, GlideForCausalLM

    if kind == "edd":
        drafter = EddForCausalLM(EddConfig.for_target(target, encoder_layer=encoder_layer))
    else:
        config = GlideConfig.for_target(target, cross_attention=kind == "glide", target_layers=target_layers)
        drafter = GlideForCausalLM(config)
    return drafter.to(next(target.parameters()).device).attach_target(target)


def resolve_device(name: str) -> torch.device:
    """``--device``'s value as a device, with a clear error for a malformed name or an accelerator this machine
    does not have (the target then runs there: nothing moves to a GPU unless asked)."""
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise SpecDecError(
            f"--device {name!r} is not a torch device; pass e.g. cpu, cuda or cuda:1"
        ) from None
    if device.type != "cpu":
        backend = getattr(torch, device.type, None)
        count = backend.device_count() if backend is not None and hasattr(backend, "device_count") else 0
        if not count or (device.index is not None and device.index >= count):
            raise SpecDecError(
                f"--device {name}: this machine has {count} {device.type} device(s); pass --device cpu or "
                "omit --device"
            )
    return device


def _run(args) -> int:
    from hf_specdec.options import parse_ints
    from hf_specdec.target import load_target

    device = resolve_device(args.device)
    target, _ = load_target(args.model, "fp32", gguf_file=args.gguf_file)
    target.to(device)
    layers = parse_ints(args.target_layers) if args.target_layers else None
    drafter = drafter_for_kind(args.kind, target, args.encoder_layer, layers)
    meta = build_features(
        target,
        drafter,
        args.corpus,
        args.out,
        args.block_size,
        args.blocks,
        args.top_k,
        args.dtype,
        args.batch_size,
    )
    print(
        f"feature store {args.out}: {meta['blocks']} blocks of {args.block_size} tokens in {meta['shards']} shards"
    )
    return 0
