"""The ``python`` tool's bubblewrap sandbox, with real bwrap and real child processes: what model-written code
may not do (write outside its tmpfs, reach the network, read the run directory or ``~/.ray``, fork without
bound, allocate without bound, run past its time), what it still may (compute, print, use its working
directory), and the refusal to load without bwrap. Tests that need bwrap skip, saying so, where it is missing."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from trinity_like.common.errors import UserError
from trinity_like.config.tools import read_tool_config
from trinity_like.explorer import tools
from trinity_like.explorer.tools import PythonTool, ToolResult

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None,
                                 reason="bubblewrap is not installed (apt-get install bubblewrap)")


@pytest.fixture(scope="module")
def box():
    """A timeout no loaded machine reaches; the timeout tests use ``quick``."""
    return PythonTool(PythonTool.Config(timeout_s=30, memory_mb=256, max_processes=8))


@pytest.fixture(scope="module")
def quick():
    return PythonTool(PythonTool.Config(timeout_s=2, memory_mb=256, max_processes=8))


def _sandbox_processes() -> list[int]:
    """Host pids running as a sandbox uid (bwrap as root gives each run one of ``_SANDBOX_UIDS``)."""
    pids = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            uid_line = next(line for line in status.read_text().splitlines() if line.startswith("Uid:"))
        except (OSError, StopIteration):
            continue  # gone meanwhile
        if int(uid_line.split()[1]) in tools._SANDBOX_UIDS:
            pids.append(int(status.parent.name))
    return pids


def _none_left() -> bool:
    """No sandbox process is left on the host (a killed pid namespace takes a moment to empty)."""
    deadline = time.monotonic() + 2.0
    while _sandbox_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _sandbox_processes()


# ---------------------------------------------------------------- (g) what it still does


@needs_bwrap
def test_normal_code_runs_and_its_output_comes_back(box):
    assert box({"code": "print(6 * 7)\nprint(sum(i * i for i in range(10)))"}) == ToolResult(True, "42\n285")
    inside = box({"code": "open('note.txt', 'w').write('hi')\nimport tempfile, os\n"
                          "print(open('note.txt').read(), tempfile.gettempdir(), os.getcwd())"})
    assert inside == ToolResult(True, "hi /sandbox /sandbox")  # the working directory (a tmpfs) is writable
    cut = PythonTool(PythonTool.Config(max_output_chars=50))({"code": "print('a' * 80)"})
    assert cut == ToolResult(True, "a" * 50 + "\n... [30 more characters cut]")  # 80 - 50 cut


@needs_bwrap
def test_code_runs_unprivileged_with_a_bare_environment(box):
    result = box({"code": "import os\nprint(os.getuid(), os.getgid(), os.getgroups())\n"
                          "print([l for l in open('/proc/self/status') if l.startswith('CapEff')][0].split()[1])\n"
                          "print(sorted(os.environ))"})
    ids, caps, env = result.text.splitlines()
    uid, gid, groups = ids.split(" ", 2)
    if os.geteuid() == 0:
        assert int(uid) in tools._SANDBOX_UIDS and gid == uid and groups == "[]"
    else:
        assert uid == gid == "65534"
    assert int(caps, 16) == 0  # no capability left
    assert env == "['HOME', 'LANG', 'PATH', 'PWD', 'TMPDIR']"  # nothing of the parent's environment (keys)


@needs_bwrap
def test_output_on_the_host_is_bounded_by_the_file_size_limit():
    tool = PythonTool(PythonTool.Config(file_size_mb=1, max_output_chars=40))
    result = tool({"code": "import sys\nsys.stdout.write('x' * (2 * 2**20))\nsys.stdout.flush()"})  # 2 MiB > 1 MiB
    assert not result.ok and result.error == "error"
    assert result.text.startswith("x" * 40 + f"\n... [{2**20 - 40} more characters cut]")  # 1 MiB reached the host
    assert result.text.endswith("OSError: [Errno 27] File too large")


# ---------------------------------------------------------------- (a) writes outside its tmpfs


@needs_bwrap
def test_writes_outside_the_tmpfs_are_refused_and_nothing_reaches_the_host(box):
    name = f"tl-escape-{uuid.uuid4().hex}"
    targets = [Path(__file__).resolve().parents[2] / name, Path("/tmp") / name, Path.home() / name]
    for target in targets:
        for code in (f"open({str(target)!r}, 'w').write('x')",
                     f"import os; os.open({str(target)!r}, os.O_WRONLY | os.O_CREAT)",
                     f"import subprocess; subprocess.run(['sh', '-c', 'echo x > {target}'], check=True)"):
            result = box({"code": code})
            assert not result.ok and result.error == "error", (code, result)
            assert any(why in result.text for why in ("No such file or directory", "Read-only file system",
                                                     "Permission denied", "CalledProcessError")), result.text
        assert not target.exists()
    assert box({"code": "import os; os.mkdir('/sandbox/d'); print(os.listdir('/sandbox'))"}).ok  # but inside: yes


# ---------------------------------------------------------------- (b) the network


@needs_bwrap
def test_no_connection_reaches_a_listener_on_the_host(box):
    with socket.socket() as server:  # a real listener, reachable from any process on this host but the tool's
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.setblocking(False)
        port = server.getsockname()[1]
        for code in (f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)",
                     f"import _socket\n_socket.socket().connect(('127.0.0.1', {port}))"):  # below any Python guard
            result = box({"code": code})
            assert not result.ok and result.error == "error"
            assert "ConnectionRefusedError" in result.text or "unreachable" in result.text, result.text
        with pytest.raises(BlockingIOError):
            server.accept()  # nothing connected
        with socket.create_connection(("127.0.0.1", port), timeout=1):  # control: the listener does accept
            pass
        assert server.accept()


# ---------------------------------------------------------------- (c) reads


@needs_bwrap
def test_the_run_directory_and_home_are_not_visible(box, tmp_path):
    secret = tmp_path / "run" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("s3cret")
    read = f"print(open({str(secret)!r}).read())"
    result = box({"code": read})
    assert not result.ok and "s3cret" not in result.text and "No such file or directory" in result.text
    guard = PythonTool(PythonTool.Config(sandbox="guard"))
    assert guard({"code": read}) == ToolResult(True, "s3cret")  # control: the weaker guard does let it read

    home = Path.home()
    listing = box({"code": f"import os\nH = {str(home)!r}\nprint(sorted(os.listdir(H)) if os.path.isdir(H) else [])\n"
                           f"print(os.path.exists({str(home / '.ray')!r}), os.path.exists({str(tmp_path)!r}))"})
    seen, flags = listing.text.splitlines()
    prefixes = {Path(p) for p in (sys.base_prefix, sys.base_exec_prefix)}
    needed = {p.relative_to(home).parts[0] for p in prefixes if home in p.parents}  # what the interpreter needs
    assert set(eval(seen)) <= needed and ".ray" not in seen  # e.g. ['.pyenv'] of /root's many entries
    assert flags == "False False"


# ---------------------------------------------------------------- (d) processes


@needs_bwrap
def test_forking_stops_at_the_process_limit_and_nothing_is_left(box):
    holders = ("import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n"
               "            time.sleep(60)\n            os._exit(0)\n        n += 1\nexcept OSError as e:\n"
               "    print(n, e.errno)")
    start = time.perf_counter()
    result = box({"code": holders})
    n, errno = result.text.split()
    assert result.ok and 0 < int(n) < 8 and errno == "11"  # EAGAIN below max_processes = 8
    assert time.perf_counter() - start < 5  # the sleepers died with the sandbox, not after 60 s
    if os.geteuid() == 0:
        assert _none_left()


@needs_bwrap
def test_a_fork_bomb_is_bounded_and_killed_at_the_timeout(quick):
    start = time.perf_counter()
    result = quick({"code": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"})
    assert result.error == "timeout" and time.perf_counter() - start < 2 + 2
    if os.geteuid() == 0:
        assert _none_left()
    assert subprocess.run(["true"], timeout=10).returncode == 0  # the host still forks
    plain = quick({"code": "import os\nwhile True: os.fork()"})  # every process dies of EAGAIN
    assert plain.error == "error" and "BlockingIOError" in plain.text


# ---------------------------------------------------------------- (e) memory


@needs_bwrap
def test_unbounded_allocation_stops_at_the_memory_limit(box):
    start = time.perf_counter()
    result = box({"code": "x = [bytearray(100 * 2**20)]\nprint('100 MiB ok', flush=True)\n"
                          "while True:\n    x.append(bytearray(10**7))"})
    assert not result.ok and result.error == "error"
    assert result.text.startswith("100 MiB ok\n") and result.text.endswith("MemoryError")  # 256 MiB limit
    assert time.perf_counter() - start < 5


# ---------------------------------------------------------------- (f) wall time


@needs_bwrap
def test_sleeping_past_the_limit_is_killed_with_what_it_started(quick):
    code = ("import subprocess, time\nsubprocess.Popen(['sleep', '60'], start_new_session=True)\n"
            "print('started', flush=True)\ntime.sleep(60)")  # the sleep escapes the process group, not the pid ns
    start = time.perf_counter()
    result = quick({"code": code})
    assert result == ToolResult(False, "started\nerror: timed out after 2 s", "timeout")
    assert time.perf_counter() - start < 2 + 2
    if os.geteuid() == 0:
        assert _none_left()


# ---------------------------------------------------------------- (h) refusal without bwrap


def test_the_tool_refuses_to_load_without_bwrap(tmp_path, monkeypatch):
    with pytest.raises(UserError) as missing:
        PythonTool(PythonTool.Config(bwrap_path=str(tmp_path / "no-bwrap")))
    message = str(missing.value)
    assert "apt-get install bubblewrap" in message and "sandbox: guard" in message and "\n" not in message
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH without bwrap: the default bwrap_path is not found
    with pytest.raises(UserError, match="apt-get install bubblewrap"):
        PythonTool(PythonTool.Config())
    tool_file = tmp_path / "tools.yaml"
    tool_file.write_text("tools:\n  - class_name: python\n    tool_schema: {type: function, function: {name: python, "
                         "parameters: {type: object, properties: {code: {type: string}}}}}\n")
    with pytest.raises(UserError, match=r"tools\[0\]: the python tool runs code under bubblewrap"):
        read_tool_config(tool_file)  # config validation stops the run there


def test_a_bwrap_that_cannot_start_a_sandbox_is_refused_too():
    with pytest.raises(UserError, match="could not run the python tool's sandbox.*sandbox: guard"):
        PythonTool(PythonTool.Config(bwrap_path=sys.executable))  # a real binary that is not bubblewrap


def test_guard_runs_without_bwrap_and_says_once_that_it_is_weaker(tmp_path, caplog):
    tools._say_guard_is_weaker.cache_clear()
    with caplog.at_level(logging.WARNING, logger="trinity_like.explorer.tools"):
        first = PythonTool(PythonTool.Config(sandbox="guard", bwrap_path=str(tmp_path / "no-bwrap")))
        PythonTool(PythonTool.Config(sandbox="guard"))
    assert [r.getMessage().count("sandbox: guard") for r in caplog.records] == [1]  # once per process
    assert first({"code": "print(1 + 1)"}) == ToolResult(True, "2")
    with pytest.raises(ValueError, match="sandbox must be one of bwrap, guard"):
        PythonTool.Config(sandbox="none")
