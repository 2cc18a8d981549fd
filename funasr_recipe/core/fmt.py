"""Figures as the reports print them."""

from __future__ import annotations


def pct(fraction: float | None, missing: str = "-", sign: bool = True) -> str:
    """``0.0782`` -> ``7.82%`` (``7.82`` without ``sign``, for a table whose header says %); ``missing``
    for None (an undefined or infinite rate)."""
    if fraction is None:
        return missing
    return f"{100 * fraction:.2f}{'%' if sign else ''}"


def num(x: float | None, digits: int = 1) -> str:
    """A figure for a table with ``digits`` decimals, "-" when there is none."""
    return "-" if x is None else f"{x:.{digits}f}"
