"""Registries filled by recursa's own entries and by other packages' entry points.

A package named e.g. `recursa-theirs` adds a model provider or a sandbox kind without touching
recursa, by declaring an entry point in its pyproject.toml:

    [project.entry-points."recursa.providers"]
    theirs = "recursa_theirs:provider"        # a recursa.models.registry.Provider, or a factory

    [project.entry-points."recursa.sandboxes"]
    mybox = "recursa_mybox:kind"              # a recursa.sandbox.kinds.SandboxKind, or a factory

Lookups are lazy: a built-in name never reads the installed packages' metadata, and the entry
points of a group are read once, the first time a name is not built in (an unknown name, or
listing every name for an error message). Loading an entry point imports only its own module.
Standard library only: front ends import this while building their parsers.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class PluginError(ValueError):
    """An entry point that cannot be loaded or does not give what its group expects."""


class Registry(Generic[T]):
    """Named entries of one kind: built-ins (given by `builtins`, called once on first use),
    entries registered in this process (`register`), and the entry points of `group`.
    An entry is a NamedTuple `kind` whose first two fields are its name and its factory: an
    entry point may give one (renamed after the entry point when its name differs) or just
    the factory."""

    def __init__(self, group: str, what: str, builtins: Callable[[], Iterable[tuple[str, T]]],
                 kind: type[T]):
        self.group = group
        self.what = what
        self._builtins_fn = builtins
        self._kind = kind
        self._key: str = kind._fields[0]      # type: ignore[attr-defined]
        self._lock = threading.Lock()
        self._builtin: dict[str, T] | None = None
        self._registered: dict[str, T] = {}
        self._points: dict[str, Any] | None = None     # name -> EntryPoint; None: not read yet
        self._loaded: dict[str, T] = {}

    def _builtins(self) -> dict[str, T]:
        if self._builtin is None:
            self._builtin = dict(self._builtins_fn())
        return self._builtin

    def register(self, name: str, entry: T, *, replace: bool = False) -> None:
        """Add (or with `replace`, replace) an entry for this process."""
        with self._lock:
            if not replace and (name in self._registered or name in self._builtins()):
                raise ValueError(f"{self.what} {name!r} is already registered "
                                 "(pass replace=True to replace it)")
            self._registered[name] = entry

    def unregister(self, name: str) -> None:
        with self._lock:
            self._registered.pop(name, None)

    def known(self, name: str) -> bool:
        """Whether `name` is an entry, without reading entry points that were not read yet."""
        return (name in self._registered or name in self._builtins()
                or (self._points is not None and name in self._points))

    def get(self, name: str) -> T | None:
        """The entry called `name` (registered, built in, or from an entry point), or None.
        Only the named entry point is loaded (imported)."""
        entry = self._registered.get(name)
        if entry is None:
            entry = self._builtins().get(name)
        if entry is None and name in self._entry_points():
            entry = self._load(name)
        return entry

    def names(self) -> list[str]:
        """Every name: built-ins first, in their order, then the others sorted (no entry point
        is loaded to list them)."""
        builtin = list(self._builtins())
        others = sorted((set(self._registered) | set(self._entry_points())) - set(builtin))
        return builtin + others

    def refresh(self) -> None:
        """Read the entry points again on the next miss (after installing a package)."""
        with self._lock:
            self._points = None
            self._loaded.clear()

    def _coerce(self, name: str, obj: Any) -> T:
        if isinstance(obj, self._kind):
            same = getattr(obj, self._key) == name
            return obj if same else obj._replace(**{self._key: name})  # type: ignore[attr-defined]
        if callable(obj):
            return self._kind(name, obj)      # type: ignore[call-arg]
        raise TypeError(f"expected a {self._kind.__module__}.{self._kind.__name__} or a "
                        f"factory, got {type(obj).__name__}")

    def _entry_points(self) -> dict[str, Any]:
        points = self._points
        if points is None:
            from importlib.metadata import entry_points
            points = {}
            for ep in entry_points(group=self.group):
                points.setdefault(ep.name, ep)   # the first on sys.path wins, as for imports
            self._points = points
        return points

    def _load(self, name: str) -> T:
        with self._lock:
            if name in self._loaded:
                return self._loaded[name]
            ep = self._entry_points()[name]
            dist = ep.dist
            where = (f"{self.what} {name!r} (entry point {ep.value!r} in group {self.group!r}"
                     + (f" of {dist.name}" if dist is not None else "") + ")")
            try:
                obj = ep.load()
            except Exception as e:
                raise PluginError(f"{where} cannot be loaded: {type(e).__name__}: {e}") from e
            try:
                entry = self._coerce(name, obj)
            except TypeError as e:
                raise PluginError(f"{where}: {e}") from e
            self._loaded[name] = entry
            return entry
