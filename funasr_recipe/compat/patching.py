"""The one way the recipe changes funasr's, DeepSpeed's and torch's code: funasr has no callback API, so
a hook wraps one method and calls the original unchanged (``wrap_method``: hooks.py, divergence.py,
finetune.py, checkpoint_io.py), and a few attributes are replaced outright (``replace``, or ``replaced``
for the length of a block: cpu.py, fused_losses.py, divergence.py's ``math``, checkpoint_io.py's saves,
train/collectives.py's timers). Each refuses a target that compat/pins.py's SURFACE does not declare, so
the pinned surface cannot fall behind the code, and keeps the installed original there (pins.py checks
it against the pins). Reads and writes nothing.

  wrap = functools.partial(wrap_method, Trainer)

  @wrap("train_epoch")
  def _(original, self, *args, **kwargs):
      ...
      return original(self, *args, **kwargs)

  replace(trainer_ds, "maybe_autocast", cpu_autocast)
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

from funasr_recipe.compat import pins


class UndeclaredTarget(RuntimeError):
    """A patch of an attribute compat/pins.py's SURFACE does not list."""


def target_of(owner: object, name: str) -> str:
    """The dotted path SURFACE names ``owner.name`` by: a module's attribute, or the class (of the owner,
    for an instance) that defines it in its MRO."""
    if isinstance(owner, ModuleType):
        return f"{owner.__name__}.{name}"
    cls = owner if isinstance(owner, type) else type(owner)
    defining = next((k for k in cls.__mro__ if name in vars(k)), cls)
    return f"{defining.__module__}.{defining.__qualname__}.{name}"


def _declared(path: str) -> str:
    if path not in pins.SURFACE:
        raise UndeclaredTarget(f"{path} is not in the pinned surface (funasr_recipe/compat/pins.py SURFACE): "
                               "add it with the installed original's signature before patching it")
    return path


def _original_of(owner: object, name: str) -> object:
    """What ``owner.name`` is now, as SURFACE describes it (the class's function for an instance)."""
    if not isinstance(owner, ModuleType | type):
        owner = type(owner)
    return getattr(owner, name, pins.missing())


def replace(owner: object, name: str, new: object, copy_of: str | None = None) -> object:
    """``setattr(owner, name, new)`` for a declared target; returns what was there. ``copy_of``: the
    attribute is a module's import-by-name copy of that declared target (fused_losses' th_accuracy), and
    must be the very same object."""
    path = target_of(owner, name)
    prior = getattr(owner, name, pins.missing())
    if copy_of is None:
        pins.remember_original(_declared(path), _original_of(owner, name))
    elif prior is not pins.original(_declared(copy_of)):
        raise UndeclaredTarget(f"{path} is not a copy of {copy_of}: it is not declared itself")
    setattr(owner, name, new)
    return prior


@contextlib.contextmanager
def replaced(owner: object, name: str, new: object) -> Iterator[object]:
    """``replace`` for the block only; afterwards ``owner`` holds what it held (an instance attribute that
    shadowed a method is removed again). Yields what was there."""
    own = getattr(owner, "__dict__", {})
    saved = own.get(name, pins.missing())  # the raw entry: a staticmethod stays one when put back
    prior = replace(owner, name, new)
    try:
        yield prior
    finally:
        if saved is pins.missing():
            delattr(owner, name)
        else:
            setattr(owner, name, saved)


def wrap_method(cls: type, name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: ``cls.name`` (declared in SURFACE) becomes ``hook(original, self, *args, **kwargs)``."""
    original = getattr(cls, name)
    _declared(target_of(cls, name))

    def decorate(hook: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def method(self, *args: Any, **kwargs: Any) -> Any:
            return hook(original, self, *args, **kwargs)

        replace(cls, name, method)
        return hook
    return decorate
