"""Objects whose privacy parameters are read-only once built.

σ, C, the sampling rate and the jitted steps are derived from an object's attributes when it
is built; assigning one afterwards would change only what the accountant is told (or what is
clipped), not what the noise was sized for. Subclasses set their attributes in ``__init__`` and
end it with ``self._freeze()``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ReadOnlyAfterInit"]


class ReadOnlyAfterInit:
    """Mixin: every attribute assignment after ``_freeze()`` raises ``AttributeError``."""

    #: What to do instead of assigning (shown in the error), e.g. "call dpjax.clipped_grad(...)".
    _REBUILD_HINT = "build a new one"
    #: What was derived from the attributes (shown in the error).
    _DERIVED = "the noise and the accounting were derived from it"

    def _freeze(self) -> None:
        object.__setattr__(self, "_frozen", True)

    def __setattr__(self, name: str, value: Any) -> None:
        if getattr(self, "_frozen", False):
            raise AttributeError(
                f"{name} of a {type(self).__name__} is read-only ({self._DERIVED}): "
                f"{self._REBUILD_HINT}"
            )
        object.__setattr__(self, name, value)
