"""``PinnedSource``: which store (or ``.lvz`` archive), which commit, which trust, as a small
picklable object that opens its handle once per process. What ``Dataset`` and the dask collections
ship to their workers instead of a handle."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, cast

from .errors import ClosedError, CorruptError, LazyvaultError, StoreNotFoundError

if TYPE_CHECKING:
    from .store import Handle

#: How a handle opens again: ``(opener, args)``, the handle's own ``__reduce__()`` (a Store: a
#: reader pinned to its version, opened at its first use; an archive: the file by path).
Reopen = tuple[Callable[..., Any], tuple[Any, ...]]


class PinnedSource:
    """A store directory read at one commit (``version``), or an archive file (``version`` None),
    with the trust (``allow_pickle``, ``safe_classes``) of the handle it was made from.

    ``reopen``: the handle's own ``__reduce__()`` recipe; ``path``: absolute; ``what``: what it is
    the source of (``"dataset"``), for the errors' advice. :meth:`open` opens the handle at its
    first use in a process (a forked child opens its own) and keeps it while this object lives;
    pickled, it carries no handle (a few hundred bytes). While the object lives in the process
    that made it (:meth:`of`), that process holds a reader pinned at that version, so the version's
    payloads are kept.
    """

    __slots__ = ("_handle", "_pid", "path", "reopen", "version", "what")

    def __init__(self, reopen: Reopen, path: str, version: int | None, what: str) -> None:
        self.reopen = reopen
        self.path = path
        self.version = version
        self.what = what
        self._pid: int | None = None  # the process that opened _handle
        self._handle: Handle | None = None

    @classmethod
    def of(cls, handle: Handle, what: str) -> PinnedSource:
        """The source of ``handle`` at the commit a pickled ``handle`` comes back at (a writer's
        last commit: its unflushed changes are not in it), opened now. Raises
        :class:`ClosedError` for a closed handle, :class:`LazyvaultError` for a writer that never
        committed, ``TypeError`` for an archive read from a buffer."""
        if handle.closed:
            raise ClosedError(f"{handle.path!r} is closed")
        version: int | None = getattr(handle, "version", None)
        if version == 0 and getattr(handle, "is_writer", False):
            raise LazyvaultError(
                f"store {handle.path!r} has no commit yet: a {what} reads the last commit, so "
                "flush() the store first"
            )
        try:
            reopen = cast(Reopen, handle.__reduce__())
        except TypeError as e:  # an archive read from a buffer
            raise TypeError(f"a {what} needs a store or archive opened by path: {e}") from None
        source = cls(reopen, os.path.abspath(str(handle.path)), version, what)
        source.open()  # a reader pinned to that version, kept while the source lives
        return source

    def open(self) -> Handle:
        """The handle, opened at the first call in this process (a reader: well under a
        millisecond, whatever the store's size). Raises what opening raises, with advice for this
        source (:meth:`reading`)."""
        pid = os.getpid()
        if self._pid != pid or self._handle is None:
            opener, args = self.reopen
            with self.reading():
                handle = cast("Handle", opener(*args))
                len(handle)  # opens a deferred store now: a version no longer kept raises here
            self._handle, self._pid = handle, pid
        return self._handle

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """Raises a :class:`StoreNotFoundError` or :class:`CorruptError` of a version or payload no
        longer kept, raised inside, with advice for this source (make a new one) instead of the
        advice for a Store (``refresh()``, open the store again)."""
        try:
            yield
        except (StoreNotFoundError, CorruptError) as e:
            mended = self._mend(e)
            if mended is e:
                raise
            raise mended from e

    def _mend(self, e: LazyvaultError) -> LazyvaultError:
        text = str(e)
        at = "" if self.version is None else f" at version {self.version}"
        advice = f"make a new {self.what} from the store"
        gone = not os.path.isfile(os.path.join(self.path, "lazyvault.json"))
        if self.version is not None and gone and not isinstance(e, StoreNotFoundError):
            e = StoreNotFoundError(text)  # its payloads are missing because the store is
        if isinstance(e, StoreNotFoundError):
            msg = (
                f"{self.path}: not found (moved or removed since this {self.what} was made from "
                f"it): make a new {self.what} from it where it is now"
            )
        elif isinstance(e, CorruptError) and "is no longer available" in text:
            msg = (
                f"{self.path}: this {self.what} reads version {self.version}, which is no longer "
                f"kept (the writer removed it once no process pinned it): {advice} (it reads the "
                "latest version)"
            )
        elif isinstance(e, CorruptError) and ": file is missing" in text:
            msg = (
                f"{text.split(': file is missing')[0]}: file is missing: this {self.what} reads "
                f"{self.path}{at}, whose payloads are no longer there (the writer removes them "
                f"once no process pins that version): {advice} (it reads the latest version)"
            )
        else:
            return e
        mended = type(e)(msg)
        for name in ("key", "array", "path"):
            if hasattr(e, name):
                setattr(mended, name, getattr(e, name))
        return mended

    def __reduce__(self) -> tuple[Any, ...]:
        return (PinnedSource, (self.reopen, self.path, self.version, self.what))

    def __repr__(self) -> str:
        at = "archive" if self.version is None else f"version={self.version}"
        return f"<lazyvault PinnedSource {self.path!r} {at}>"
