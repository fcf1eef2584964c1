"""One-line error messages: a run reports a failure in one line and goes on."""

from __future__ import annotations


def first_line(error: object) -> str:
    """The first non-empty line of `error`'s message; the exception's type name when it has none."""
    for line in str(error).strip().splitlines():
        if line.strip():
            return line.strip()
    return type(error).__name__ if isinstance(error, BaseException) else ""
