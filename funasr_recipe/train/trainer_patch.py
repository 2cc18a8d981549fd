"""The one way the recipe hooks funasr's Trainer: funasr has no callback API, so a hook wraps one method
of the class and calls the original unchanged (hooks.py, divergence.py). Reads and writes nothing.

  wrap = functools.partial(wrap_method, Trainer)

  @wrap("train_epoch")
  def _(original, self, *args, **kwargs):
      ...
      return original(self, *args, **kwargs)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any


def wrap_method(cls: type, name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: ``cls.name`` becomes ``hook(original, self, *args, **kwargs)``."""
    original = getattr(cls, name)

    def decorate(hook: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def method(self, *args: Any, **kwargs: Any) -> Any:
            return hook(original, self, *args, **kwargs)

        setattr(cls, name, method)
        return hook
    return decorate
