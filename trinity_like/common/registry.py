"""A name -> function registry where every entry has one signature (STYLE.md rule 2)."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Generic, TypeVar

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    """A plain dict filled by a decorator; registering a name twice is an error, and looking up an unknown
    name raises KeyError listing the valid names (never a silent None)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        def deco(fn: F) -> F:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = fn
            return fn

        return deco

    def get(self, name: str) -> F:
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(f"unknown {self.kind} {name!r}; valid names: {', '.join(self.names())}") from None

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._entries))

    def __contains__(self, name: str) -> bool:
        return name in self._entries


def import_module_ref(ref: str, prefix: str, what: str) -> ModuleType:
    """The module ``ref`` names: an import path, or a ``.py`` file's path (loaded as ``<prefix>_<its stem>``) for the
    user's own code (workflows, reward functions); ImportError naming ``what`` when the file does not exist."""
    import importlib
    import importlib.util
    from pathlib import Path

    if not ref.endswith(".py"):
        return importlib.import_module(ref)
    path = Path(ref).expanduser().absolute()
    if not path.is_file():
        raise ImportError(f"{what} '{path}' does not exist")
    spec = importlib.util.spec_from_file_location(f"{prefix}_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

