"""User-facing errors: one line that says what is wrong and what to do (the CLI exits 2 on them)."""


class SpecDecError(ValueError):
    """Bad input detected early; the message names the fix."""


def require(condition: bool, message: str) -> None:
    """Raise :class:`SpecDecError` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise SpecDecError(message)
