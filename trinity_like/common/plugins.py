"""Plugin folders: user modules imported before workflows and reward functions are looked up.

Trinity-RFT users keep their workflows and reward functions in a folder of ``.py`` files whose
``@WORKFLOWS.register_module("name")`` / ``@REWARD_FUNCTIONS.register_module("name")`` decorators register them
on import (Trinity's ``--plugin-dir`` and ``TRINITY_PLUGIN_DIRS``). Here the folders come from
``explorer.plugin_dirs`` and the same environment variable (``os.pathsep``-separated), and every ``.py`` file in
them (not ``__*.py``) is imported once per process, in name order, as module ``trinity_like_plugins.<stem>``.

Departure from Trinity: a folder that does not exist, or a file that fails to import, is an error naming it
(Trinity logs and goes on, and the run then fails later on an unknown workflow name).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from collections.abc import Iterable
from pathlib import Path

PLUGIN_DIRS_ENV = "TRINITY_PLUGIN_DIRS"
"""Environment variable naming plugin folders, ``os.pathsep``-separated (Trinity's name)."""

PACKAGE = "trinity_like_plugins"
"""The package plugin modules are imported under."""


class PluginError(ImportError):
    """A plugin folder that is not there, or a plugin file that fails to import; the message names it."""


def plugin_dirs(configured: Iterable[str] = ()) -> list[Path]:
    """The plugin folders of this process: ``configured`` (``explorer.plugin_dirs``), then those of
    ``TRINITY_PLUGIN_DIRS``, each once, as absolute paths."""
    env = [d for d in os.environ.get(PLUGIN_DIRS_ENV, "").split(os.pathsep) if d.strip()]
    out: list[Path] = []
    for d in [*configured, *env]:
        path = Path(d).expanduser().absolute()
        if path not in out:
            out.append(path)
    return out


def import_plugins(configured: Iterable[str] = ()) -> list[str]:
    """Import every ``.py`` file of the plugin folders (``plugin_dirs``) not imported yet in this process; return
    the module names imported now. PluginError naming the folder or file when one is missing or fails."""
    if PACKAGE not in sys.modules:  # a namespace for the plugin modules, so relative names never clash
        pkg = types.ModuleType(PACKAGE)
        pkg.__path__ = []
        sys.modules[PACKAGE] = pkg
    done: list[str] = []
    for folder in plugin_dirs(configured):
        if not folder.is_dir():
            raise PluginError(f"plugin folder '{folder}' (explorer.plugin_dirs or {PLUGIN_DIRS_ENV}) is not a "
                              "folder; name a folder of .py files")
        for file in sorted(folder.glob("*.py")):
            if file.name.startswith("__"):
                continue
            name = f"{PACKAGE}.{file.stem}"
            loaded = sys.modules.get(name)
            if loaded is not None:
                if Path(getattr(loaded, "__file__", "")).absolute() != file:
                    raise PluginError(f"plugin file '{file}' has the same name as '{loaded.__file__}', imported "
                                      "already; rename one of them")
                continue
            spec = importlib.util.spec_from_file_location(name, file)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            if str(folder) not in sys.path:  # a plugin may import its neighbours by their plain names
                sys.path.append(str(folder))
            try:
                spec.loader.exec_module(module)
            except Exception as e:
                del sys.modules[name]
                raise PluginError(f"plugin file '{file}' failed to import: {type(e).__name__}: {e}") from None
            done.append(name)
    return done
