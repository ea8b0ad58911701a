"""Start each build's child process from a warm Python that has already imported the runtimes.

A fresh interpreter spends 1 to 3 s importing onnx, ONNX Runtime, OpenVINO and
NNCF before a build starts, and as long again tearing them down: more than a
small model's whole build. The fork server imports them once (`PRELOAD`), then
forks one child per request. Each child is what `python -m workers.backends.isolate`
would be: a process of its own session (a kill reaches everything it starts),
its stdin, stdout and stderr the pipes the caller passed, its exit code the
one a crash gives. The server is the caller's child: it exits when the caller
closes its socket or dies. Set DEPLOYHUB_FORK_SERVER=0 to start every child
from scratch instead.
"""

import ctypes
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from contextlib import suppress

logger = logging.getLogger(__name__)
MODULE = "workers.backends.forkserver"
# Imported once by the server, in this order; a module that is not installed is skipped.
# workers.backends.known comes first: importing the OpenVINO backend turns telemetry off.
PRELOAD = (
    "workers.backends.known",
    "workers.backends.isolate",
    "workers.measure.feeds",
    "numpy",
    "onnx",
    "onnx.version_converter",
    "onnxruntime",
    "onnxruntime.quantization",
    "onnxruntime.quantization.shape_inference",
    "openvino",
    "nncf",
)
# Variables that change while the caller runs and that no build reads: a change of any other
# variable starts a new server, whose imports see it.
VOLATILE = ("PYTEST_CURRENT_TEST",)
START_SECONDS = 120
ORPHAN_WAIT_SECONDS = 5
MESSAGE_BYTES = 4096


class ForkServerError(OSError):
    """The fork server could not start a child (the caller falls back to a fresh Python)."""


def enabled():
    """Return True unless DEPLOYHUB_FORK_SERVER turns the fork server off."""
    return os.environ.get("DEPLOYHUB_FORK_SERVER", "1").lower() not in ("0", "false", "no", "off")


class ForkServer:
    """A warm server process and the caller's end of its socket."""

    def __init__(self, env):
        self.env = _lasting(env)
        self._socket, theirs = socket.socketpair()
        self.process = subprocess.Popen(
            [sys.executable, "-m", MODULE, str(theirs.fileno())],
            env=env,
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        self._lock = threading.Lock()  # one request at a time: its answer is the next pid
        self._pids, self._exits, self._exited = [], {}, threading.Condition()
        self._broken = False  # a request went unanswered: later answers would not match
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def alive(self):
        """Return True while the server runs and answers."""
        return not self._broken and self.process.poll() is None and self._reader.is_alive()

    def spawn(self, stdin, stdout, stderr):
        """Fork a child with these file descriptors as its 0, 1 and 2; return its pid."""
        with self._lock:
            try:
                socket.send_fds(self._socket, [b"fork\n"], [stdin, stdout, stderr])
            except OSError as error:
                self._broken = True
                raise ForkServerError(f"the fork server is gone: {error}") from error
            with self._exited:
                if not self._exited.wait_for(lambda: self._pids or not self.alive(), START_SECONDS):
                    self._broken = True  # its late answer would be taken for the next request's
                    raise ForkServerError("the fork server did not answer")
                if not self._pids:
                    raise ForkServerError("the fork server stopped")
                return self._pids.pop(0)

    def exit_code(self, pid, timeout=None):
        """Return a child's exit code (negative: killed by that signal), None while it runs."""
        with self._exited:
            self._exited.wait_for(lambda: pid in self._exits or not self.alive(), timeout)
            return self._exits.pop(pid, None)

    def close(self):
        """Stop the server (children already started run on)."""
        self._broken = True
        with suppress(OSError):
            self._socket.shutdown(socket.SHUT_RDWR)  # the reader's file keeps the fd open
            self._socket.close()
        with suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def _read(self):
        """Read the server's answers: each child's pid as it forks, its exit code as it ends."""
        with suppress(OSError), self._socket.makefile("r") as answers:
            for line in answers:
                answer = json.loads(line)
                with self._exited:
                    if "pid" in answer:
                        self._pids.append(answer["pid"])
                    else:
                        self._exits[answer["exit"]] = answer["code"]
                    self._exited.notify_all()
        with self._exited:
            self._exited.notify_all()


class ForkedChild:
    """A child the fork server started, with the parts of subprocess.Popen that isolate uses."""

    def __init__(self, server):
        self._server = server
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        stderr_r, stderr_w = os.pipe()
        try:
            self.pid = server.spawn(stdin_r, stdout_w, stderr_w)
        except BaseException:
            for fd in (stdin_w, stdout_r, stderr_r):
                os.close(fd)
            raise
        finally:
            for fd in (stdin_r, stdout_w, stderr_w):
                os.close(fd)
        self.stdin = os.fdopen(stdin_w, "wb")
        self.stdout = os.fdopen(stdout_r, "rb")
        self.stderr = os.fdopen(stderr_r, "rb")
        self.returncode = None
        self.exit_lost = False  # the server died before it could say how the child ended

    def poll(self):
        """Return the exit code once the child has ended, else None."""
        return self.wait(timeout=0)

    def wait(self, timeout=None):
        """Wait for the child to end; return its exit code (None when timeout passed)."""
        if self.returncode is None:
            self.returncode = self._server.exit_code(self.pid, timeout)
        if self.returncode is None and not self._server.alive():
            # The server died, and this exit code with it: wait (briefly, when asked to wait)
            # for the child to be gone, then report it as killed.
            deadline = time.monotonic() + (ORPHAN_WAIT_SECONDS if timeout is None else timeout)
            while _exists(self.pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if not _exists(self.pid) or timeout is None:
                self.returncode, self.exit_lost = -signal.SIGKILL, True
        return self.returncode


def _exists(pid):
    """Return True while a process with this pid runs (a child the dead server left)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_server = None
_server_lock = threading.Lock()


def start_child(env):
    """Return a ForkedChild from this process's fork server for env (started or restarted)."""
    global _server
    with _server_lock:
        if _server is not None and (_server.env != _lasting(env) or not _server.alive()):
            _server.close()
            _server = None
        if _server is None:
            _server = ForkServer(env)
        server = _server
    return ForkedChild(server)


def _lasting(env):
    """Return env without the VOLATILE variables."""
    return {name: value for name, value in env.items() if name not in VOLATILE}


def main(fd):
    """Serve: preload, then fork a child for each request on the socket until it closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the caller's to handle
    server = socket.socket(fileno=fd)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the select below
    _preload()
    while True:
        ready, _, _ = select.select([server, wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
        _reap(server)
        if server in ready and not _serve_one(server, wake_r, wake_w):
            exit_now(0)  # the caller has gone: no module teardown to hang in


def _preload():
    """Import what builds import, so that each forked child starts with it."""
    for module in PRELOAD:
        try:
            __import__(module)
        except Exception as error:  # not installed, or broken: the child will say so itself
            print(f"fork server: not preloading {module}: {error}", file=sys.stderr)


def _serve_one(server, *wake):
    """Fork a child for one request; return False when the caller has gone."""
    try:
        message, fds, _, _ = socket.recv_fds(server, MESSAGE_BYTES, 3)
    except OSError:
        return False
    if not message:
        return False
    sys.stdout.flush()
    sys.stderr.flush()
    with suppress(Exception):
        ctypes.CDLL(None).fflush(None)  # or the child would write the server's buffers again
    pid = os.fork()
    if pid == 0:
        _become_child(fds, server, *wake)
    for fd in fds:
        os.close(fd)
    _answer(server, {"pid": pid})
    return True


def _reap(server):
    """Tell the caller the exit code of each child that has ended."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _answer(server, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def _answer(server, message):
    with suppress(OSError):
        server.sendall((json.dumps(message) + "\n").encode())


def _become_child(fds, server, *wake):
    """In the forked child: take the request's pipes as 0, 1 and 2 and run isolate's main."""
    code = 1
    try:
        os.setsid()
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGINT, signal.SIGCHLD, signal.SIGTERM):
            signal.signal(signum, signal.SIG_DFL)
        server.close()
        for fd in wake:
            os.close(fd)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        from workers.backends import isolate

        code = isolate.main()
    except BaseException:
        traceback.print_exc()  # before os._exit, which prints nothing
    finally:
        exit_now(code)


def exit_now(code):
    """Flush what Python and native code buffered, then exit without tearing modules down."""
    for stream in (sys.stdout, sys.stderr):
        with suppress(Exception):
            stream.flush()
    with suppress(Exception):
        ctypes.CDLL(None).fflush(None)
    os._exit(code)


if __name__ == "__main__":
    main(int(sys.argv[1]))
