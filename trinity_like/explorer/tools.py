"""Tools for the ``tool_agent`` workflow: the built-in tools, the toolbox built from the tool config file, and
tool calls in model text.

The tool config file (``explorer.tool_config_path``, verl's shape) is read and checked by
:mod:`trinity_like.config.tools`, which config validation uses too; it declares each built-in (``BUILTIN_TOOLS``:
the one string argument it reads, its settings), and ``TOOLS`` here holds the implementations, by the same names.

Tool calls are parsed from the model's text in the Hermes / Qwen format that chat templates use:
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, several per turn. Every ``<tool_call>`` opening
tag is one call: malformed JSON, a missing closing tag, an unknown tool or a missing argument is a failed call
whose error text goes back to the model like any result.

The ``python`` tool runs code under bubblewrap (kernel namespaces, read-only file system, unprivileged user,
rlimits), or with ``sandbox: guard`` under weaker in-process guards: see :class:`PythonTool`.
"""

from __future__ import annotations

import ast
import functools
import json
import logging
import math
import operator
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trinity_like.common.errors import UserError
from trinity_like.common.registry import Registry
from trinity_like.config.tools import CALCULATOR, PYTHON, ToolSpec, find_bwrap, read_tool_config

logger = logging.getLogger(__name__)

ERROR_KINDS = ("bad_call", "error", "timeout")
"""``ToolResult.error``: ``bad_call`` the call could not be made (malformed JSON, unknown tool, missing
argument); ``error`` the tool ran and failed (a refused expression, an exception, a non-zero exit); ``timeout``
it ran past its time limit."""


@dataclass(frozen=True)
class ToolResult:
    """What one tool call gives back: ``text`` goes to the model either way."""

    ok: bool
    text: str
    error: str | None = None
    """None when ``ok``; else one of ``ERROR_KINDS``."""


class Tool:
    """A built-in tool: built once from its settings (``Config``, a dataclass), then called with the model's
    arguments. Each reads one string argument, ``argument``; both come from its declaration in
    ``BUILTIN_TOOLS`` (``trinity_like.config.tools``), which the tool config file was checked against."""

    argument: str = ""
    """The argument the tool reads; the tool's schema must declare it."""

    @dataclass
    class Config:
        pass

    def __init__(self, config: Any) -> None:
        self.config = config

    def __call__(self, arguments: dict[str, Any]) -> ToolResult:
        value = arguments.get(self.argument)
        if not isinstance(value, str):
            return ToolResult(False, f"missing argument {self.argument!r} (a string)", "bad_call")
        return self.run(value)

    def run(self, value: str) -> ToolResult:
        raise NotImplementedError


TOOLS: Registry = Registry("tool")
"""Built-in tool name -> ``Tool`` subclass, one per entry of ``BUILTIN_TOOLS``; every entry is built as
``cls(settings)`` (``settings``: a ``cls.Config``, checked from the tool config file) and called as
``tool(arguments) -> ToolResult``."""


# ---------------------------------------------------------------- calculator


class _Refused(Exception):
    """An expression the calculator will not evaluate; the message says why."""


_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}


@TOOLS.register(CALCULATOR.name)
class CalculatorTool(Tool):
    """Evaluates an arithmetic expression: numbers, ``+ - * / // % **``, unary minus and plus, parentheses.
    Nothing else is accepted (no names, no calls, no attributes): the expression is parsed with ``ast`` and
    walked, never ``eval``-ed. Exponents and every intermediate value are bounded, and a power whose result
    would pass the bound is refused before it is computed, so ``9**9**9`` returns at once."""

    argument = CALCULATOR.argument
    Config = CALCULATOR.settings

    def run(self, value: str) -> ToolResult:
        if len(value) > self.config.max_length:
            return ToolResult(False, f"error: expression longer than {self.config.max_length} characters", "error")
        try:
            tree = ast.parse(value.strip(), mode="eval")
            result = self._eval(tree.body)
        except SyntaxError:
            return ToolResult(False, "error: not an arithmetic expression", "error")
        except ZeroDivisionError:
            return ToolResult(False, "error: division by zero", "error")
        except (_Refused, OverflowError, RecursionError) as e:
            return ToolResult(False, f"error: {e}" if str(e) else "error: result too large", "error")
        return ToolResult(True, _number_text(result))

    def _eval(self, node: ast.AST) -> int | float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return self._bounded(node.value)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](self._eval(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = self._eval(node.left), self._eval(node.right)
            if isinstance(node.op, ast.Pow):
                self._check_power(left, right)
            return self._bounded(_BINARY[type(node.op)](left, right))
        if isinstance(node, ast.Constant):
            raise _Refused(f"only numbers are allowed, not {node.value!r}")
        if isinstance(node, ast.Name):
            raise _Refused(f"names are not allowed ({node.id!r}); use numbers only")
        if isinstance(node, ast.Call):
            raise _Refused("function calls are not allowed; use + - * / // % ** and parentheses")
        raise _Refused(f"{type(node).__name__} is not allowed; use numbers, + - * / // % ** and parentheses")

    def _check_power(self, base: float, exponent: float) -> None:
        if abs(exponent) > self.config.max_exponent:
            raise _Refused(f"exponent {exponent} is larger than {self.config.max_exponent}")
        if abs(base) > 1 and exponent > 0 and exponent * math.log10(abs(base)) > math.log10(self.config.max_magnitude):
            raise _Refused(f"result larger than {self.config.max_magnitude:g}")

    def _bounded(self, value: Any) -> int | float:
        if isinstance(value, complex):
            raise _Refused("the result is not a real number")
        if isinstance(value, float) and not math.isfinite(value) or abs(value) > self.config.max_magnitude:
            raise _Refused(f"result larger than {self.config.max_magnitude:g}")
        return value


def _number_text(value: int | float) -> str:
    """Integers exactly; floats with 12 significant digits, without a trailing ``.0`` (``6/3`` -> ``2``)."""
    return str(value) if isinstance(value, int) else format(value, ".12g")


# ---------------------------------------------------------------- python

_LIMITS = r"""
import os, resource, signal, sys
memory_b, cpu_s, fsize_b, nproc, uid = (int(x) for x in sys.argv[1:6])
limits = [(resource.RLIMIT_AS, memory_b), (resource.RLIMIT_CPU, cpu_s), (resource.RLIMIT_FSIZE, fsize_b),
          (resource.RLIMIT_CORE, 0)] + ([(resource.RLIMIT_NPROC, nproc)] if nproc else [])
for limit, value in limits:
    resource.setrlimit(limit, (value, value))
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past RLIMIT_FSIZE raises OSError instead of killing
if uid >= 0:  # bwrap ran as root: become a uid of our own (no capabilities left, so no limit can be raised)
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
del limits, limit, value, memory_b, cpu_s, fsize_b, nproc, uid, resource, signal
"""
"""Runs first in the child: hard resource limits, then (bwrap as root) the drop to an unprivileged uid."""

_GUARD = r"""
import builtins, io, socket
try:  # a network namespace of our own has no interface but a down loopback: nothing is reachable
    import ctypes
    _libc = ctypes.CDLL(None, use_errno=True)
    if _libc.unshare(0x40000000) != 0 and _libc.unshare(0x10000000 | 0x40000000) == 0:  # NEWNET; NEWUSER|NEWNET
        _uid, _gid = os.geteuid(), os.getegid()  # map ourselves, else creating files fails (EOVERFLOW)
        for _name, _text in (("setgroups", "deny"), ("uid_map", f"{_uid} {_uid} 1"), ("gid_map", f"{_gid} {_gid} 1")):
            with open(f"/proc/self/{_name}", "w") as _f:
                _f.write(_text)
    del ctypes, _libc
except (OSError, AttributeError):
    pass
def _no_network(*args, **kwargs):
    raise PermissionError("network access is disabled in this sandbox")
class _NoSocket(socket.socket):
    def __init__(self, *args, **kwargs):
        _no_network()
socket.socket = _NoSocket
socket.create_connection = socket.create_server = socket.socketpair = socket.fromfd = _no_network
_root = os.path.realpath(os.getcwd())
_open, _os_open = io.open, os.open
def _inside(path):
    if isinstance(path, int):
        return True
    real = os.path.realpath(os.fspath(path))
    return real == _root or real.startswith(_root + os.sep)
def _guarded_open(file, mode="r", *args, **kwargs):
    if any(c in mode for c in "wax+") and not _inside(file):
        raise PermissionError(f"writing outside the sandbox directory is not allowed: {file!r}")
    return _open(file, mode, *args, **kwargs)
def _guarded_os_open(path, flags, *args, **kwargs):
    if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC) and not _inside(path):
        raise PermissionError(f"writing outside the sandbox directory is not allowed: {path!r}")
    return _os_open(path, flags, *args, **kwargs)
builtins.open = io.open = _guarded_open
os.open = _guarded_os_open
del builtins, io, socket
"""
"""``sandbox: guard`` only: the network namespace (when the kernel allows it) and the in-process network and
write guards."""

_RUN = r"""
with open("main.py", encoding="utf-8") as _f:
    _source = _f.read()
try:
    exec(compile(_source, "main.py", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
except SystemExit:
    raise
except BaseException as _e:  # the traceback from the user's code on, without this bootstrap's frame
    import traceback
    traceback.print_exception(type(_e), _e, _e.__traceback__.tb_next)
    sys.exit(1)
"""
"""Runs last: the code of ``main.py`` in the working directory."""

_BOX = "/sandbox"
"""The working directory inside the bwrap sandbox: a tmpfs of its own, HOME and TMPDIR too."""

_SANDBOX_UIDS = range(2_000_000_000, 2_100_000_000)
"""bwrap as root: each run becomes a uid drawn from here, which no account uses, so RLIMIT_NPROC (counted per uid)
counts that run's processes only, and runs going on at once do not share one budget."""

_SANDBOX_USER = "65534"
"""bwrap as another user: the uid and gid inside its user namespace (nobody); RLIMIT_NPROC counts per user
namespace, so again per run."""


@TOOLS.register(PYTHON.name)
class PythonTool(Tool):
    """Runs a code string in a fresh Python process and returns what it printed.

    ``sandbox: bwrap`` (the default) runs it under bubblewrap (``bwrap``), enforced by the kernel:
    - no network: a network namespace of its own (``--unshare-net``): only its own loopback, where nothing listens;
    - a read-only file system holding only ``/usr``, ``/lib*``, ``/bin``, the interpreter's prefix, ``/etc``'s
      ``ld.so.cache`` and ``localtime``, a fresh ``/proc`` and a minimal ``/dev``: the run directory, the
      project, ``/root``, ``~/.ray`` and the host's ``/tmp`` are not there. The working directory (and HOME,
      TMPDIR) is a tmpfs of ``file_size_mb``, gone with the run; the code arrives there as ``main.py``. The
      interpreter is the base one (``sys._base_executable``) with its own site-packages: a virtualenv's
      packages are not mounted;
    - an unprivileged user: as root, bwrap runs without a user namespace and the child drops to a uid of
      its own (``_SANDBOX_UIDS``) before the code runs; as any other user, ``--unshare-user`` makes it
      uid 65534 in a user namespace whose nesting is disabled. Either way no capability is left, and
      ``no_new_privs`` (bwrap's) stops setuid binaries. (``--unshare-user`` as root would map the sandbox
      to root outside, which the kernel exempts from RLIMIT_NPROC: tried here, a fork bomb ran on.)
    - pid, ipc and uts namespaces of its own (``--unshare-pid``: when its first process ends, the kernel
      ends every other), ``--new-session`` (no terminal to inject into), ``--die-with-parent``;
    - hard rlimits set before the code runs, which an unprivileged process cannot raise: ``RLIMIT_AS``
      ``memory_mb``, ``RLIMIT_CPU`` ``timeout_s`` + 1 s, ``RLIMIT_FSIZE`` ``file_size_mb`` (its stdout and
      stderr files on the host included), ``RLIMIT_NPROC`` ``max_processes``, no core files;
    - wall time ``timeout_s``: the process group is killed then, which ends the sandbox's pid namespace;
    - output: stdout cut to ``max_output_chars`` (stderr's end on failure).
    The tool refuses to load when bwrap is missing or cannot start a sandbox (say ``sandbox: guard`` to
    accept the weaker guard). What it does not stop: CPU time across ``max_processes`` processes (only the
    wall time bounds it), reads of what is mounted (the standard library, ``/usr``), and, as root, a nested
    user namespace (``--disable-userns`` needs ``--unshare-user``, ruled out above): root over its own copy of
    the same read-only view, not over the host, but more of the kernel to attack.

    ``sandbox: guard`` runs the old, weaker way, said once in the log: ``python -I`` as the explorer's user in a
    temporary directory, with the same rlimits (no RLIMIT_NPROC), a network namespace when the kernel allows it,
    and ``open`` / ``socket`` replaced in the child's interpreter so that writes outside the directory and
    sockets are refused. Code reaching below those (``_socket``, ``ctypes``, a subprocess) gets round them,
    and it can read whatever the explorer's user can.

    Either way: ``python -I`` (no user site, no PYTHON* variables) with an environment of PATH, HOME and LANG
    (TMPDIR under bwrap), so the parent's variables (keys) are not passed on. Limits are set in the child's own
    first lines rather than a ``preexec_fn``: the workflow calls tools from worker threads
    (``asyncio.to_thread``), and ``preexec_fn`` is not safe in a process with threads."""

    argument = PYTHON.argument
    Config = PYTHON.settings

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self._bwrap: str | None = None
        """The resolved bubblewrap binary; None with ``sandbox: guard``."""
        if config.sandbox == "guard":
            _say_guard_is_weaker()
            return
        self._bwrap = find_bwrap(config)
        probe = self.run("print('ok')")
        if probe != ToolResult(True, "ok"):
            raise UserError(f"bubblewrap ({self._bwrap}) could not run the python tool's sandbox on this machine "
                            f"({probe.text.strip().splitlines()[-1] if probe.text.strip() else probe.error}); fix "
                            "that or set the tool's config sandbox: guard to accept the weaker in-process guard")

    def run(self, value: str) -> ToolResult:
        c = self.config
        with tempfile.TemporaryDirectory(prefix="tl-python-") as box:
            work = Path(box) / "work"
            work.mkdir()
            (work / "main.py").write_text(value, encoding="utf-8")
            out, err = Path(box) / "stdout", Path(box) / "stderr"
            with open(out, "wb") as stdout, open(err, "wb") as stderr, open(work / "main.py", "rb") as source:
                if self._bwrap is None:
                    env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": str(work), "LANG": "C.UTF-8"}
                    argv, cwd, fds = [sys.executable, "-I", "-c", _LIMITS + _GUARD + _RUN, *self._limits(-1)], work, ()
                else:
                    env, cwd, fds = {"PATH": os.defpath}, box, (source.fileno(),)
                    argv = self._bwrap_argv(source.fileno())
                proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=stdout,
                                        stderr=stderr, pass_fds=fds, start_new_session=True)  # its own group
                try:
                    code = proc.wait(timeout=c.timeout_s)
                    timed_out = False
                except subprocess.TimeoutExpired:
                    timed_out = True
                finally:
                    _kill_group(proc)
            printed = _head(out.read_text(errors="replace").rstrip("\n"), c.max_output_chars)
            errors = _tail(err.read_text(errors="replace"), c.max_output_chars)
        if timed_out:
            return ToolResult(False, f"{printed}\nerror: timed out after {c.timeout_s:g} s".lstrip(), "timeout")
        if code != 0:
            reason = errors.strip() or f"exited with status {code}" + (
                f" (signal {signal.Signals(-code).name})" if code < 0 else "")
            return ToolResult(False, f"{printed}\n{reason}".lstrip(), "error")
        return ToolResult(True, printed if printed else "(no output)")

    def _limits(self, uid: int) -> list[str]:
        """The bootstrap's arguments: RLIMIT_AS, RLIMIT_CPU, RLIMIT_FSIZE, RLIMIT_NPROC (0: unset) and the uid to
        become (-1: stay)."""
        c = self.config
        nproc = c.max_processes if self._bwrap is not None else 0
        return [str(c.memory_mb * 2**20), str(math.ceil(c.timeout_s) + 1), str(c.file_size_mb * 2**20), str(nproc),
                str(uid)]

    @functools.cached_property
    def _bwrap_base(self) -> list[str]:
        """The bwrap command line up to the code's file: the same for every run of this tool (``PythonTool``'s
        docstring says why each part is there), so worked out once."""
        argv = [self._bwrap, "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
                "--unshare-cgroup-try", "--new-session", "--die-with-parent"]
        if os.geteuid() == 0:  # keep only what the drop to an unprivileged uid needs; it drops those too
            argv += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        else:
            argv += ["--unshare-user", "--uid", _SANDBOX_USER, "--gid", _SANDBOX_USER, "--disable-userns"]
        argv += ["--ro-bind", "/usr", "/usr"]
        for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
            if os.path.islink(top):  # merged /usr: /lib -> usr/lib
                argv += ["--symlink", os.readlink(top), top]
            elif os.path.isdir(top):
                argv += ["--ro-bind", top, top]
        made = set()
        for tree in sorted({sys.base_prefix, sys.base_exec_prefix, os.path.dirname(_python())}):
            if tree == "/usr" or tree.startswith("/usr/"):
                continue
            for parent in reversed(Path(tree).parents[:-1]):  # bwrap would make them 0700: unreadable after the drop
                if parent not in made:
                    made.add(parent)
                    argv += ["--perms", "0755", "--dir", str(parent)]
            argv += ["--ro-bind", tree, tree]
        for path in ("/etc/ld.so.cache", "/etc/localtime"):
            argv += ["--ro-bind-try", path, path]
        return argv + ["--proc", "/proc", "--dev", "/dev",
                       "--perms", "0777", "--size", str(self.config.file_size_mb * 2**20), "--tmpfs", _BOX]

    def _bwrap_argv(self, source_fd: int) -> list[str]:
        """The bwrap command line of one run: the code's file descriptor and, as root, a fresh uid."""
        argv = self._bwrap_base + [
            "--file", str(source_fd), f"{_BOX}/main.py", "--remount-ro", "/", "--chdir", _BOX,
            "--clearenv", "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--setenv", "HOME", _BOX,
            "--setenv", "TMPDIR", _BOX, "--setenv", "LANG", "C.UTF-8", "--"]
        uid = random.randrange(_SANDBOX_UIDS.start, _SANDBOX_UIDS.stop) if os.geteuid() == 0 else -1
        return argv + [_python(), "-I", "-c", _LIMITS + _RUN, *self._limits(uid)]


def _python() -> str:
    """The base interpreter (a virtualenv's is a link to it, and its packages are not mounted)."""
    return os.path.realpath(getattr(sys, "_base_executable", sys.executable))


@functools.cache
def _say_guard_is_weaker() -> None:
    """Once per process: ``sandbox: guard`` is not a security boundary."""
    logger.warning("the python tool runs with sandbox: guard, in-process guards that code can get round (it "
                   "can read what the explorer's user can); install bubblewrap and drop that setting for the "
                   "kernel-enforced sandbox")


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the child's process group (whatever it started too) and reap the child."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _head(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n] + f"\n... [{len(text) - n} more characters cut]"


def _tail(text: str, n: int) -> str:
    return text if len(text) <= n else f"[{len(text) - n} characters cut] ...\n" + text[-n:]


# ---------------------------------------------------------------- tool calls in model text

_CALL = re.compile(r"<tool_call>(.*?)(</tool_call>|(?=<tool_call>)|\Z)", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    """One ``<tool_call>`` block of the model's text."""

    name: str | None
    """The tool it names; None when the block could not be read."""
    arguments: dict[str, Any] = field(default_factory=dict)
    problem: str | None = None
    """Why the block could not be read (then the call fails with this text)."""


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every ``<tool_call>...</tool_call>`` block of ``text``, in order. A block must hold a JSON object with
    ``name`` (a string) and ``arguments`` (an object, or a string holding one as OpenAI sends it; absent = {})."""
    calls = []
    for m in _CALL.finditer(text):
        body, closed = m.group(1).strip(), bool(m.group(2))
        if not closed:
            calls.append(ToolCall(None, problem="the <tool_call> has no closing </tool_call>"))
            continue
        try:
            data = json.loads(body)
        except json.JSONDecodeError as e:
            calls.append(ToolCall(None, problem=f"the tool call is not valid JSON ({e.msg} at character {e.pos})"))
            continue
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            calls.append(ToolCall(None, problem='a tool call is a JSON object {"name": ..., "arguments": {...}}'))
            continue
        args = data.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                pass
        if not isinstance(args, dict):
            calls.append(ToolCall(data["name"], problem="the tool call's arguments must be a JSON object"))
            continue
        calls.append(ToolCall(data["name"], args))
    return calls


# ---------------------------------------------------------------- the toolbox


class Toolbox:
    """The configured tools, by name, each built once."""

    def __init__(self, tools: Iterable[tuple[ToolSpec, Tool]] = ()) -> None:
        self.specs: dict[str, ToolSpec] = {}
        self._tools: dict[str, Tool] = {}
        for spec, tool in tools:
            self.specs[spec.name], self._tools[spec.name] = spec, tool

    def __contains__(self, name: str | None) -> bool:
        return name in self._tools

    def call(self, call: ToolCall) -> ToolResult:
        """Run one parsed call; a call that cannot be made is a failed result, never an exception."""
        if call.problem is not None:
            return ToolResult(False, f"error: {call.problem}", "bad_call")
        if call.name not in self._tools:
            known = ", ".join(sorted(self._tools)) or "none are configured"
            return ToolResult(False, f"error: unknown tool {call.name!r}; available tools: {known}", "bad_call")
        return self._tools[call.name](call.arguments)

    def preamble(self) -> str:
        """The tool descriptions and the call format, for the top of the prompt; empty without tools. Each
        tool is one line ``- name(arg: type, ...): description`` (short: small models have short contexts)."""
        if not self.specs:
            return ""
        lines = ["Tools:"]
        for spec in self.specs.values():
            props = spec.parameters.get("properties", {})
            args = ", ".join(f"{k}: {v.get('type', 'any') if isinstance(v, dict) else 'any'}" for k, v in props.items())
            lines.append(f"- {spec.name}({args}): {spec.description}")
        lines.append('Call a tool with <tool_call>{"name": ..., "arguments": {...}}</tool_call>.')
        return "\n".join(lines)


def load_tools(path: str | Path) -> Toolbox:
    """The tools of a tool config file (read and checked by ``trinity_like.config.tools.read_tool_config``),
    each built once; UserError naming the file, what is wrong and how to fix it."""
    return Toolbox((spec, TOOLS.get(spec.builtin)(settings)) for spec, settings in read_tool_config(path))


# ---------------------------------------------------------------- metrics


def tool_metrics(infos: Iterable[dict[str, Any]]) -> dict[str, float]:
    """``rollout/tool_calls/<name>`` and ``rollout/tool_failures/<name>``: sums over experiences' ``info``
    counts, for every tool called at least once (calls to no configured tool count under ``_invalid``)."""
    calls: Counter[str] = Counter()
    failures: Counter[str] = Counter()
    for info in infos:
        calls.update(info.get("tool_calls") or {})
        failures.update(info.get("tool_failures") or {})
    out = {f"rollout/tool_calls/{name}": float(n) for name, n in sorted(calls.items())}
    out.update({f"rollout/tool_failures/{name}": float(failures[name]) for name in sorted(calls)})
    return out

