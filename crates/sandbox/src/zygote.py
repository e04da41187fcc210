# trace-train sandbox zygote.
#
# One of these runs per worker slot. It is started by the Rust executor
# (crates/sandbox/src/worker.rs) inside the slot's private mount, network, IPC and
# UTS namespaces, imports the common standard library once, then serves
# requests on fd 0 / fd 1. Every program runs in a process forked from here,
# so the interpreter's start-up cost is paid once per worker, not per program.
#
# Sandbox mode: the zygote is pid 1 of the worker's own pid namespace (the
# executor clones it so), with its own /proc. Per program it mounts a fresh
# size-capped tmpfs on /tmp and forks P, which drops to the slot's uid, sets
# rlimits, no_new_privs and seccomp, and runs the program in-process. When P
# has exited (or the deadline or an output cap is hit) the zygote sends
# SIGKILL to every other process of the namespace (kill(-1) from its init)
# and reaps until it has no child left, then unmounts /tmp: daemons,
# grandchildren and fork bombs never outlive their program, and nothing of
# the program's files remains.
#
# Rootless (not run as root): the executor clones the zygote into a user
# namespace of its own as well, mapping the caller's uid to the slot's uid,
# and mounts /tmp before the exec; the exec then leaves the zygote with no
# capabilities. P keeps that uid instead of switching to it. Every slot is
# the caller's uid on the host.
#
# Unsafe mode (--unsafe_no_sandbox): P gets its own session and rlimits only;
# leftovers are killed by process group, the temp dir is removed.
#
# Wire format (all integers big-endian u32 lengths):
#   init:     len + JSON config           -> reply: len + JSON {"python": ...}
#   request:  len + JSON limits, len + program bytes, len + stdin bytes
#   response: len + JSON outcome, len + stdout bytes, len + stderr bytes
#
# Session (the request's JSON has "session": true; the slot serves nothing
# else afterwards): P runs the program long-lived, its stdin, stdout and
# stderr pipes to the zygote, which relays lines until P or the executor
# ends, then kills every process of the namespace and exits:
#   executor -> zygote:  len + one line (no newline; the zygote adds it)
#   zygote -> executor:  len + "L" + one line of P's stdout (no newline),
#                        and once, at the end: len + "E" + JSON report
#                        (P's wait status, killed_for, P's stderr's tail)
# A line of P longer than the request's stdout_bytes kills P
# (killed_for "output_limit"); stderr keeps only its last bytes.
#
# This file is trusted code; it never evaluates anything from a request
# except inside P, after every protection is in place.

import atexit
import builtins
import ctypes
import json
import os
import select
import shutil
import signal
import struct
import sys
import time
import types

# Modules worth having warm: what competitive-programming style code imports.
# A program pays nothing for these; a fresh interpreter pays up to 20 ms
# (dataclasses) for each. Forking costs the same with or without them.
import array  # noqa: F401
import ast  # noqa: F401  (the transform uses it)
import bisect  # noqa: F401
import collections  # noqa: F401
import copy  # noqa: F401
import dataclasses  # noqa: F401
import datetime  # noqa: F401
import decimal  # noqa: F401
import enum  # noqa: F401
import fractions  # noqa: F401
import functools  # noqa: F401
import heapq  # noqa: F401
import itertools  # noqa: F401
import linecache
import math  # noqa: F401
import operator  # noqa: F401
import random
import re  # noqa: F401
import resource
import statistics  # noqa: F401
import string  # noqa: F401
import threading
import traceback
import typing  # noqa: F401

MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
PR_SET_DUMPABLE = 4
PR_SET_SECCOMP = 22
PR_SET_NO_NEW_PRIVS = 38
SECCOMP_MODE_FILTER = 2

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def check(rc, what):
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, "%s: %s" % (what, os.strerror(err)))


def read_exact(fd, n):
    chunks = []
    while n:
        b = os.read(fd, min(n, 1 << 20))
        if not b:
            raise EOFError
        chunks.append(b)
        n -= len(b)
    return b"".join(chunks)


def read_frame(fd):
    (n,) = struct.unpack(">I", read_exact(fd, 4))
    return read_exact(fd, n)


def write_all(fd, data):
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def write_frames(fd, *frames):
    parts = []
    for f in frames:
        parts.append(struct.pack(">I", len(f)))
        parts.append(f)
    write_all(fd, b"".join(parts))


# The executor ends a worker by closing its pipes, and a stop signal is the
# executor's to handle: Ctrl-C reaching the whole process group must not end
# the zygote with a KeyboardInterrupt traceback in the user's terminal. P
# gets the interpreter's own handlers back (`program_main`).
signal.signal(signal.SIGINT, signal.SIG_IGN)

CONFIG = json.loads(read_frame(0))
SANDBOXED = CONFIG["mode"] == "sandbox"
# Rootless: the zygote already is the slot's uid in its own user namespace,
# with no capabilities; the executor mounted /tmp before the exec.
ROOTLESS = SANDBOXED and CONFIG.get("rootless", False)
UID = CONFIG.get("uid", 0)
GID = CONFIG.get("gid", 0)
if SANDBOXED:
    if os.getpid() != 1:
        # kill(-1) below is only safe from a namespace's init.
        raise SystemExit("trace-train sandbox: zygote must be pid 1 of its namespace")
    if ROOTLESS:
        # Programs share the zygote's uid: a zygote that cannot be dumped
        # cannot be read or written through /proc/1 by them.
        check(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(DUMPABLE)")
    else:
        # One size-capped tmpfs for the slot's programs, emptied after each.
        TMP_OPTS = "size=%d,nr_inodes=%d,mode=1777" % (CONFIG["tmp_bytes"], CONFIG["tmp_inodes"])
        check(libc.mount(b"tmpfs", b"/tmp", b"tmpfs", MS_NOSUID | MS_NODEV, TMP_OPTS.encode()), "mount /tmp")
    # Lock the zygote itself down: every program inherits the seccomp filters
    # and no_new_privs through fork. The zygote needs none of what they deny
    # (it mounted everything it ever will just above).
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    for hexprog in CONFIG.get("seccomp", []):
        raw = bytes.fromhex(hexprog)
        buf = ctypes.create_string_buffer(raw, len(raw))
        prog = SockFprog(len(raw) // 8, ctypes.addressof(buf))
        check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(prog), 0, 0), "prctl(SECCOMP)")

# Frozen objects are never touched by the collector, so forked children
# share the zygote's pages instead of copying them on the first gc pass.
import gc  # noqa: E402

gc.collect()
gc.freeze()

write_frames(1, json.dumps({"python": sys.version.split()[0]}).encode())


def program_main(limits, program, work):
    """Runs in P, as the program would run under a fresh `python3 main.py`."""
    path = os.path.join(work, "main.py")
    # The zygote never reads or writes through sys.stdin/stdout/stderr (it
    # speaks raw fds), so those objects are still as the interpreter built
    # them for fds 0-2: after the dup2s they are a fresh run's streams, with
    # its encoding, error handlers and buffering.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.argv = ["main.py"]
    sys.path[0] = work
    # `random` was imported warm, but its own at-fork hook reseeded it from
    # os.urandom in this process, as a fresh interpreter would seed it.
    module = types.ModuleType("__main__")
    module.__file__ = path
    module.__builtins__ = builtins
    sys.modules["__main__"] = module
    try:
        text = program.decode("utf-8")
        # Tracebacks show source lines from here; no file is written.
        linecache.cache[path] = (len(text), None, text.splitlines(True), path)
    except UnicodeDecodeError:
        pass
    rc = 0
    try:
        try:
            code = compile(program, path, "exec", dont_inherit=True)
            exec(code, module.__dict__)
        except SystemExit as e:
            rc = exit_code_of(e)
        except BaseException:
            t, v, tb = sys.exc_info()
            # Drop this runner's own frame, as the interpreter would show none.
            if tb is not None and tb.tb_next is not None:
                tb = tb.tb_next
                v.__traceback__ = tb
            if sys.excepthook is sys.__excepthook__:
                # The pure-Python printer reads source lines from linecache
                # (no file is written); its format is the interpreter's.
                traceback.print_exception(t, v, tb)
            else:
                sys.excepthook(t, v, tb)
            rc = 1
        # Interpreter shutdown order: join non-daemon threads, atexit, flush.
        if threading.active_count() > 1:
            try:
                threading._shutdown()
            except BaseException:
                pass
        try:
            atexit._run_exitfuncs()
        except SystemExit as e:
            rc = exit_code_of(e)
        except BaseException:
            pass
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                if stream is sys.stdout:
                    rc = 120
    finally:
        os._exit(rc)


def exit_code_of(e):
    code = e.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        sys.stderr.write(str(code) + "\n")
    except BaseException:
        pass
    return 1


def set_limits(limits):
    cpu = int(limits["cpu_seconds"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_bytes"], limits["memory_bytes"]))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_size_bytes"], limits["file_size_bytes"]))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits["open_files"], limits["open_files"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if SANDBOXED:
        resource.setrlimit(resource.RLIMIT_NPROC, (limits["processes"], limits["processes"]))


def become_program(limits, program, stdin_fd, out_w, err_w, setup_w, work):
    """In P: wire fds, drop privileges, set limits, run. Never returns.

    A set-up failure is reported on `setup_w`, which is closed before the
    program runs: a program cannot forge one (its exit code and stderr are
    its own), so it can never pass its failure off as the sandbox's."""
    try:
        os.dup2(stdin_fd, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.closerange(3, setup_w)
        os.closerange(setup_w + 1, 1 << 16)
        os.chdir(work)
        if SANDBOXED:
            if not ROOTLESS:
                os.setgroups([])
                os.setresgid(GID, GID, GID)
                os.setresuid(UID, UID, UID)
            check(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(DUMPABLE)")
        else:
            os.setsid()
        set_limits(limits)
    except BaseException as e:
        try:
            os.write(setup_w, ("setup failed: %r" % (e,)).encode())
        finally:
            os._exit(125)
    os.close(setup_w)
    program_main(limits, program, work)


def kill_leftovers(child):
    """Kill every process of the program but P's zombie, then reap all."""
    if SANDBOXED:
        # From a namespace's init, kill(-1) reaches every other process in
        # the namespace and nothing outside it. Repeat until no child is
        # left: a fork bomb may add processes while the first signal goes out.
        while True:
            try:
                os.kill(-1, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                pid, _ = os.waitpid(-1, 0)
            except ChildProcessError:
                return
    else:
        try:
            os.killpg(child, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def serve_one(limits, program, stdin_data):
    t0 = time.monotonic()
    stdin_fd = os.memfd_create("stdin", 0)
    write_all(stdin_fd, stdin_data)
    os.lseek(stdin_fd, 0, os.SEEK_SET)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    setup_r, setup_w = os.pipe()
    if SANDBOXED:
        work = "/tmp"
    else:
        import tempfile

        work = tempfile.mkdtemp(prefix="trace-train-")
    child = os.fork()
    if child == 0:
        try:
            os.close(out_r)
            os.close(err_r)
            os.close(setup_r)
            become_program(limits, program, stdin_fd, out_w, err_w, setup_w, work)
        finally:
            os._exit(127)
    for fd in (stdin_fd, out_w, err_w, setup_w):
        os.close(fd)
    child_fd = os.pidfd_open(child)

    deadline = t0 + limits["wall_ms"] / 1000.0
    caps = {out_r: limits["stdout_bytes"], err_r: limits["stderr_bytes"]}
    bufs = {out_r: [], err_r: []}
    truncated = {out_r: False, err_r: False}
    open_fds = [out_r, err_r, child_fd]
    status = None
    killed_for = None
    while open_fds:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            killed_for = "wall_timeout"
            break
        ready, _, _ = select.select(open_fds, [], [], remaining)
        for fd in ready:
            if fd == child_fd:
                # P is gone: whatever it left behind goes too, which closes
                # the pipes a grandchild might still hold.
                _, st, ru = os.wait4(child, 0)
                status = {"wait": st, "cpu": ru.ru_utime + ru.ru_stime, "maxrss_kb": ru.ru_maxrss}
                open_fds.remove(child_fd)
                kill_leftovers(child)
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                open_fds.remove(fd)
                continue
            size = sum(map(len, bufs[fd]))
            if size + len(chunk) > caps[fd]:
                chunk = chunk[: caps[fd] - size]
                truncated[fd] = True
                killed_for = "output_limit"
            bufs[fd].append(chunk)
        if killed_for:
            break
    if status is None:
        os.kill(child, signal.SIGKILL)
        _, st, ru = os.wait4(child, 0)
        status = {"wait": st, "cpu": ru.ru_utime + ru.ru_stime, "maxrss_kb": ru.ru_maxrss}
    kill_leftovers(child)
    # Every process that could hold setup_w is gone: this read cannot block.
    setup_error = os.read(setup_r, 4096)
    if setup_error:
        status["error"] = setup_error.decode("utf-8", "replace")
    for fd in (out_r, err_r, child_fd, setup_r):
        os.close(fd)
    retire = False
    if SANDBOXED:
        # Nothing of this program may reach the next: empty /tmp. Should that
        # fail, the executor replaces this worker (and its tmpfs) instead.
        try:
            for name in os.listdir(work):
                path = os.path.join(work, name)
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path)
                else:
                    os.unlink(path)
            retire = bool(os.listdir(work))
        except OSError:
            retire = True
    else:
        shutil.rmtree(work, ignore_errors=True)
    report = {
        "wall_ms": (time.monotonic() - t0) * 1000.0,
        "stdout_truncated": truncated[out_r],
        "stderr_truncated": truncated[err_r],
        "killed_for": killed_for,
        "child": status,
        "retire": retire,
    }
    return report, b"".join(bufs[out_r]), b"".join(bufs[err_r])


def serve_session(limits, program):
    """Runs `program` as P, long-lived, and relays lines between the
    executor and P (see the wire format above). Never returns: the zygote
    exits after P, so nothing of the session outlives it."""
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    setup_r, setup_w = os.pipe()
    if SANDBOXED:
        work = "/tmp"
    else:
        import tempfile

        work = tempfile.mkdtemp(prefix="trace-train-")
    child = os.fork()
    if child == 0:
        try:
            for fd in (in_w, out_r, err_r, setup_r):
                os.close(fd)
            become_program(limits, program, in_r, out_w, err_w, setup_w, work)
        finally:
            os._exit(127)
    for fd in (in_r, out_w, err_w, setup_w):
        os.close(fd)
    del program
    child_fd = os.pidfd_open(child)
    # P may stop reading its stdin: lines wait here rather than block the
    # zygote, which must go on reading P's output and the executor's frames.
    os.set_blocking(in_w, False)
    line_cap = limits["stdout_bytes"]
    tail_cap = min(limits["stderr_bytes"], 1 << 16)
    # bytearrays: appending and dropping a consumed front are cheap.
    from_host = bytearray()
    to_child = bytearray()
    line = []  # the pieces of P's unfinished line
    line_len = 0
    tail = b""
    status = None
    killed_for = None
    readers = [0, out_r, err_r, child_fd]

    def forward(chunk):
        """Sends P's complete lines on; False when a line is over the cap.
        A long line's pieces wait in a list (joined once, when it ends)."""
        nonlocal line, line_len
        if b"\n" not in chunk:
            line.append(chunk)
            line_len += len(chunk)
            return line_len <= line_cap
        parts = chunk.split(b"\n")
        line.append(parts[0])
        parts[0] = b"".join(line)
        last = parts.pop()
        line, line_len = [last], len(last)
        for p in parts:
            if len(p) > line_cap:
                return False
            write_frames(1, b"L" + p)
        return line_len <= line_cap

    while status is None and killed_for is None:
        writers = [in_w] if to_child else []
        ready, writable, _ = select.select(readers, writers, [])
        if writable:
            try:
                n = os.write(in_w, to_child)
                del to_child[:n]
            except BlockingIOError:
                pass
            except BrokenPipeError:
                to_child.clear()  # P closed its stdin; its exit is seen below
        for fd in ready:
            if fd == 0:
                chunk = os.read(0, 1 << 16)
                if not chunk:
                    killed_for = "closed"  # the executor is gone
                    break
                from_host += chunk
                while len(from_host) >= 4:
                    (n,) = struct.unpack(">I", from_host[:4])
                    if len(from_host) < 4 + n:
                        break
                    to_child += from_host[4 : 4 + n]
                    to_child += b"\n"
                    del from_host[: 4 + n]
            elif fd == out_r:
                chunk = os.read(out_r, 1 << 16)
                if not chunk:
                    readers.remove(out_r)
                elif not forward(chunk):
                    killed_for = "output_limit"
                    break
            elif fd == err_r:
                chunk = os.read(err_r, 1 << 16)
                if not chunk:
                    readers.remove(err_r)
                tail = (tail + chunk)[-tail_cap:]
            elif fd == child_fd:
                _, st, ru = os.wait4(child, 0)
                status = {"wait": st, "cpu": ru.ru_utime + ru.ru_stime, "maxrss_kb": ru.ru_maxrss}
    if status is None:
        os.kill(child, signal.SIGKILL)
        _, st, ru = os.wait4(child, 0)
        status = {"wait": st, "cpu": ru.ru_utime + ru.ru_stime, "maxrss_kb": ru.ru_maxrss}
    kill_leftovers(child)
    # Every writer is gone: what P wrote before it ended is read to the end
    # (its last answer may precede its exit).
    if killed_for is None:
        for fd, keep in ((out_r, True), (err_r, False)):
            while fd in readers:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    break
                if keep and not forward(chunk):
                    killed_for = "output_limit"
                    break
                if not keep:
                    tail = (tail + chunk)[-tail_cap:]
    setup_error = os.read(setup_r, 4096)
    if setup_error:
        status["error"] = setup_error.decode("utf-8", "replace")
    if not SANDBOXED:
        shutil.rmtree(work, ignore_errors=True)
    report = {"killed_for": killed_for, "child": status, "stderr": tail.decode("utf-8", "replace")}
    try:
        write_frames(1, b"E" + json.dumps(report).encode())
    except OSError:
        pass
    os._exit(0)


while True:
    try:
        header = read_frame(0)
        program = read_frame(0)
        stdin_data = read_frame(0)
    except (EOFError, OSError):
        # The executor closed the pipe or went away (a stopped run): leave
        # quietly, there is nobody to answer.
        os._exit(0)
    limits = json.loads(header)
    if limits.get("session"):
        try:
            serve_session(limits, program)
        except BaseException as e:
            try:
                write_frames(1, b"E" + json.dumps({"zygote_error": repr(e)}).encode())
            finally:
                os._exit(1)
    try:
        report, out, err = serve_one(limits, program, stdin_data)
    except BaseException as e:  # a zygote fault is a sandbox failure, not a program failure
        report, out, err = {"zygote_error": repr(e)}, b"", b""
    del program, stdin_data
    try:
        write_frames(1, json.dumps(report).encode(), out, err)
    except OSError:  # BrokenPipeError: the executor stopped reading
        os._exit(0)
