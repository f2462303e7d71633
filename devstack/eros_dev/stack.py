"""The local stack's processes: the embedded Postgres 16 + pgvector (started, joined, stopped), and ``eros serve``
with its pid file, which ``eros stop`` (``make stop``) reads."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from . import data_dir

# pgserver asks platformdirs for a runtime folder, which warns on every start where XDG_RUNTIME_DIR is unset
# (containers, CI, ssh sessions) and falls back to /tmp; the fallback is fine, the warning is noise.
warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")


def postgres_running(folder: Path | None = None) -> bool:
    """Whether the embedded Postgres of ``folder`` (default .data/pg) is up (its postmaster.pid exists)."""
    return ((folder or data_dir() / "pg") / "postmaster.pid").exists()


def stop_embedded_postgres(folder: Path | None = None) -> bool:
    """Stop the embedded Postgres of ``folder`` (a fast shutdown: sessions are ended, nothing is lost);
    False when it was not running. Stopped by someone else meanwhile (``eros stop`` and the ``eros serve`` that
    started it may both get here) is stopped: pg_ctl then fails for want of a server, which is no error."""
    from pgserver._commands import pg_ctl  # type: ignore[attr-defined]  # made by a factory at import

    folder = folder or data_dir() / "pg"
    if not postgres_running(folder):
        return False
    runs_as = {"user": "pgserver"} if os.geteuid() == 0 else {}  # pgserver runs it as this user under root
    try:
        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=folder, **runs_as)
    except subprocess.CalledProcessError:
        if postgres_running(folder):
            raise
    return True


@contextmanager
def serving() -> Iterator[None]:
    """While ``eros serve`` runs: its process id in .data/serve.pid, for ``eros stop``, and SIGTERM (what
    ``eros stop`` sends) handled as Ctrl-C."""
    pid_file = data_dir() / "serve.pid"
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    pid_file.write_text(str(os.getpid()))
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        if pid_file.exists() and pid_file.read_text().strip() == str(os.getpid()):
            pid_file.unlink()


def stop_local_stack(wait_secs: float = 120.0) -> list[str]:
    """``make stop``: ask a running ``eros serve`` to stop (SIGTERM, which it handles as Ctrl-C: it then stops
    the Postgres it started; SIGINT would not reach a stack started in the background, where it is ignored),
    wait until it has exited, then stop the embedded Postgres if it is still up (one that ``eros serve`` joined
    rather than started, or of a serve that did not exit within ``wait_secs``). Returns what was stopped.

    The wait is for the process, not for a fixed time: a stack stops its Postgres itself (a shutdown checkpoint),
    which a loaded machine can make slow, and stopping it from here meanwhile (after a fixed 15 s, before) raced
    that shutdown."""
    stopped = []
    pid_file = data_dir() / "serve.pid"
    pid = int(pid_file.read_text()) if pid_file.exists() and pid_file.read_text().strip().isdigit() else None
    if pid is not None and _alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + wait_secs
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        stopped.append(f"eros serve (pid {pid})")
    pid_file.unlink(missing_ok=True)
    if stop_embedded_postgres():
        stopped.append("the embedded Postgres")
    return stopped


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a process that has exited but not been reaped (a zombie: the parent's Popen has not waited yet)
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):  # no /proc (macOS): kill(0) is all there is
        return True


def embedded_postgres(folder: Path | None = None) -> str:
    """Start (or join) the embedded Postgres 16 + pgvector in ``folder``; returns its URL."""
    import pgserver

    folder = folder or data_dir() / "pg"
    folder.mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(str(folder), cleanup_mode=None)
    return server.get_uri()
