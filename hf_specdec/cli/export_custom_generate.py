"""``hf-specdec export-custom-generate METHOD DIR``: write a decoding method as a Hub ``custom_generate`` folder
(``hf_specdec/custom_generate_export.py`` does the work)."""

from __future__ import annotations

from ..custom_generate_export import EXPORTS, NOT_EXPORTED, export_custom_generate


def add_parser(sub) -> None:
    p = sub.add_parser(
        "export-custom-generate",
        help="write DIR/custom_generate/ (generate.py, requirements.txt, bundled modules) and DIR/README.md: "
        "model.generate(..., custom_generate=DIR or its Hub repo, trust_remote_code=True) without hf_specdec",
    )
    p.add_argument("method", choices=sorted([*EXPORTS, *NOT_EXPORTED]), help="the decoding method")
    p.add_argument("dir", help="output folder (push it as a Hub repo to share the strategy)")
    p.set_defaults(func=_run)


def _run(args) -> int:
    folder = export_custom_generate(args.method, args.dir)
    print(
        f"wrote {folder}: call it with model.generate(..., custom_generate={str(folder)!r}, trust_remote_code=True)"
    )
    return 0
