"""``--option KEY=VALUE`` of ``hf-specdec bench`` as the methods read them: strings, and checked that some method
read each key (a misspelt key is an error, not a silent run with the defaults)."""

from __future__ import annotations

from ..errors import SpecDecError


class MethodOptions(dict):
    """``--option KEY=VALUE`` values that remember which keys the methods asked for, so that a key no method reads
    (a misspelt ``--option glid=PATH``) is an error rather than a run with the default drafter (:func:`check_read`)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.asked: set[str] = set()

    def get(self, key, default=None):
        self.asked.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.asked.add(key)
        return super().__getitem__(key)

    def __contains__(self, key) -> bool:
        self.asked.add(key)
        return super().__contains__(key)


def option_strings(options: dict | None) -> MethodOptions:
    """``--option KEY=VALUE`` values as the methods read them, strings, also when ``run_bench`` is called from
    Python with numbers or booleans (``{"chain_cost": 0}`` or ``False`` is ``"0"``, not a true value)."""
    return MethodOptions(
        {k: ("1" if v else "0") if isinstance(v, bool) else str(v) for k, v in (options or {}).items()}
    )


def check_read(options: MethodOptions, names: list[str]) -> None:
    """Fail when an ``--option`` key was read by none of the methods (after their setup and warm-up)."""
    unread = sorted(set(options) - options.asked)
    if unread:
        raise SpecDecError(
            f"--option {', '.join(unread)}: no method of {', '.join(names)} reads it; they read "
            f"{', '.join(sorted(options.asked)) or 'no options'} (e.g. --option glide=PATH for a GLIDE drafter, "
            "edd=PATH for EDD's; the method modules' docstrings list each method's options)"
        )
