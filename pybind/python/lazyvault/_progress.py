"""Progress bars for long operations, with tqdm: ``progress=`` as :class:`~lazyvault.Store` says."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["ProgressArg", "Report", "progress_callback"]

ProgressArg = bool | Callable[[int, Any], Any] | None
"""What a ``progress=`` parameter takes: None, True, False or ``f(done, total)``."""

Report = Callable[[int, int | None], None]
"""A ``(done, total)`` callback as :func:`progress_callback` yields it."""


def _interactive() -> bool:
    if "ipykernel" in sys.modules:
        return True
    stream = sys.stderr
    return stream is not None and hasattr(stream, "isatty") and stream.isatty()


@contextmanager
def progress_callback(progress: ProgressArg, desc: str, unit: str) -> Iterator[Report | None]:
    """A ``(done, total)`` callback (for the Rust core or a Python loop), or None for no report; the
    tqdm bar closes when the block ends. Raises ``TypeError`` for a ``progress`` not None, a bool or
    a callable."""
    if progress is None:
        progress = _interactive()
    if progress is False:
        yield None
        return
    if progress is not True:
        if not callable(progress):
            raise TypeError(
                f"progress must be None, True, False or a callable(done, total), "
                f"not {type(progress).__name__}"
            )
        yield progress
        return
    from tqdm.auto import tqdm

    bar = tqdm(desc=desc, unit=unit, total=None, leave=False)

    def update(done: int, total: int | None) -> None:
        # every caller reports (0, total) first, as soon as it knows the total:
        # drawn at once (tqdm redraws only on progress, at most every 0.1 s)
        changed = bar.total != total
        bar.total = total
        bar.update(done - bar.n)
        if changed:
            bar.refresh()

    try:
        yield update
    finally:
        bar.close()
