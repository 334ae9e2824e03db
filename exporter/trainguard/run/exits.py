"""How the interpreter's end reaches a ``trainguard.Run``: a failure or a clean finish.

An uncaught exception runs ``sys.excepthook`` before atexit, so the hook remembers it and the
atexit handler reports a failure rather than a clean finish (the cases are listed in
:mod:`trainguard.run.reporter.run`). A forked child (a DataLoader worker) inherits both hooks and
must never end its parent's run: the exception is only remembered in the process that made the
hooks.
"""

from __future__ import annotations

import atexit
import os
import sys
import weakref
from collections.abc import Callable
from types import TracebackType

from trainguard.run.options import type_name


class ExitHooks:
    """The atexit handler and the ``sys.excepthook`` (chained to the previous one) of one run.

    At the interpreter's end ``finish(state, error)`` is called with ``("failed", <exception
    type>)`` after an uncaught exception, else ``("finished", None)``.
    """

    def __init__(self, finish: Callable[[str, str | None], object]) -> None:
        self._finish = finish
        self._pid = os.getpid()
        self.uncaught: str | None = None
        previous = self._previous = sys.excepthook
        ref = weakref.ref(self)

        def hook(
            exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None
        ) -> None:
            hooks = ref()
            if hooks is not None and os.getpid() == hooks._pid:
                hooks.uncaught = type_name(exc_type)
            previous(exc_type, exc, tb)

        self._hook = hook
        sys.excepthook = hook
        atexit.register(self._at_exit)

    def remove(self) -> None:
        """The run ended by itself: neither hook is needed any more."""
        atexit.unregister(self._at_exit)
        if sys.excepthook is self._hook:
            sys.excepthook = self._previous

    def _at_exit(self) -> None:
        if self.uncaught is not None:
            self._finish("failed", self.uncaught)
        else:
            self._finish("finished", None)
