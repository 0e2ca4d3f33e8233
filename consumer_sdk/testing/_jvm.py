"""Local Kafka JVMs: finding Java and a Kafka distribution, starting, signalling and stopping
process groups, and finding JVMs this process started that are still running.

Every function runs on the calling thread. A JVM started here is tagged with this process's
pid (a ``-D`` system property) and registered, so `leaked_kafka_jvms` finds it even when the
object that started it is gone; on Linux it also dies with the thread that started it when
that is the main thread (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from consumer_sdk.testing._cluster_ops import KafkaClusterError

logger = logging.getLogger("consumer_sdk.testing")

_MIN_KAFKA = (4, 0)
_MIN_JAVA = 17
_OWNER_PROPERTY = "consumer_sdk.testing.owner"

# -- prerequisites ----------------------------------------------------------------------------

_JAVA_VERSIONS: dict[str, int] = {}


def find_java(java_home: str | os.PathLike[str] | None = None) -> str:
    """The java executable (``java_home``, else ``JAVA_HOME``, else PATH), checked to be 17+."""
    home = java_home if java_home is not None else os.environ.get("JAVA_HOME") or None
    if home is not None:
        java = Path(home) / "bin" / "java"
        if not java.is_file() or not os.access(java, os.X_OK):
            raise KafkaClusterError(
                f"no Java found: {java} does not exist or is not executable "
                f"(JAVA_HOME={os.fspath(home)!r}); Kafka 4.x needs Java {_MIN_JAVA}+"
            )
        path = str(java)
    else:
        found = shutil.which("java")
        if found is None:
            raise KafkaClusterError(
                f"no Java found: set JAVA_HOME or put a Java {_MIN_JAVA}+ 'java' on PATH "
                "(Kafka 4.x brokers need it)"
            )
        path = found
    major = _JAVA_VERSIONS.get(path)
    if major is None:
        major = _java_major(path)
        _JAVA_VERSIONS[path] = major
    if major < _MIN_JAVA:
        raise KafkaClusterError(f"{path} is Java {major}; Kafka 4.x needs Java {_MIN_JAVA}+")
    return path


def _java_major(java: str) -> int:
    try:
        out = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise KafkaClusterError(f"cannot run {java} -version: {exc}") from exc
    text = out.stderr + out.stdout
    match = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if match is None:
        raise KafkaClusterError(f"cannot tell the Java version of {java} from: {text.strip()!r}")
    major = int(match.group(1))
    if major == 1 and match.group(2):  # "1.8.0_..." style
        major = int(match.group(2))
    return major


_JAR_VERSION_RES = (
    re.compile(r"^kafka_\d+\.\d+-(\d+)\.(\d+)\.(\d+)[^/]*?\.jar$"),
    re.compile(r"^kafka-server-(\d+)\.(\d+)\.(\d+)[^/]*?\.jar$"),
)
_NOT_MAIN_JAR = re.compile(r"-(test|sources|javadoc|scaladoc|test-sources)\.jar$")


def kafka_distribution_version(kafka_home: str | os.PathLike[str]) -> tuple[int, int, int]:
    """The Kafka version of a distribution directory, from its ``libs/`` jars.

    Raises KafkaClusterError naming the problem when ``kafka_home`` is not a Kafka
    distribution.
    """
    home = Path(kafka_home)
    if not home.is_dir():
        raise KafkaClusterError(
            f"KAFKA_HOME={os.fspath(kafka_home)!r} is not a directory "
            "(expected an Apache Kafka 4.x distribution: bin/, config/, libs/)"
        )
    libs = home / "libs"
    if not libs.is_dir():
        raise KafkaClusterError(
            f"KAFKA_HOME={os.fspath(kafka_home)!r} has no libs/ directory: not a Kafka "
            "distribution (download and extract kafka_2.13-4.x.tgz and point KAFKA_HOME at it)"
        )
    for pattern in _JAR_VERSION_RES:
        for jar in sorted(libs.iterdir()):
            match = pattern.match(jar.name)
            if match and not _NOT_MAIN_JAR.search(jar.name):
                return (int(match.group(1)), int(match.group(2)), int(match.group(3)))
    raise KafkaClusterError(
        f"KAFKA_HOME={os.fspath(kafka_home)!r} has no kafka_2.13-X.Y.Z.jar or "
        "kafka-server-X.Y.Z.jar in libs/: not a Kafka distribution"
    )


def check_kafka_home(kafka_home: str | os.PathLike[str] | None) -> Path:
    """The resolved distribution directory (``kafka_home``, else ``KAFKA_HOME``), checked to be
    Kafka >= 4.0; KafkaClusterError saying what is wrong otherwise."""
    home = kafka_home if kafka_home is not None else os.environ.get("KAFKA_HOME") or None
    if home is None:
        raise KafkaClusterError(
            "no Kafka distribution: pass kafka_home= or set KAFKA_HOME to an extracted "
            "Apache Kafka 4.x download (https://kafka.apache.org/downloads)"
        )
    version = kafka_distribution_version(home)
    if version[:2] < _MIN_KAFKA:
        raise KafkaClusterError(
            f"KAFKA_HOME={os.fspath(home)!r} is Kafka {'.'.join(map(str, version))}; "
            f"KafkaCluster needs Kafka >= {'.'.join(map(str, _MIN_KAFKA))} "
            "(KRaft and the KIP-848 consumer group protocol)"
        )
    return Path(home).resolve()


# -- process bookkeeping ----------------------------------------------------------------------

_PR_SET_PDEATHSIG = 1
_prctl: Any = None
if sys.platform.startswith("linux"):  # pragma: no branch - resolved once, in the parent
    with contextlib.suppress(OSError, AttributeError, TypeError):
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        _prctl = _libc.prctl


def _die_with_parent() -> None:  # runs in the forked child before exec: no allocation
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


_ALL_PROCS: dict[int, subprocess.Popen[bytes]] = {}
_ALL_PROCS_LOCK = threading.Lock()


def _alive(proc: subprocess.Popen[bytes]) -> bool:
    return proc.poll() is None


def leaked_kafka_jvms() -> list[int]:
    """Pids of KafkaCluster JVMs started by this process that are still running.

    Uses both the launched ``Popen`` objects and, on Linux, a scan of ``/proc`` for JVMs
    tagged with this process's pid, so it also finds nodes whose cluster object is gone.
    """
    pids: set[int] = set()
    with _ALL_PROCS_LOCK:
        procs = list(_ALL_PROCS.values())
    pids.update(p.pid for p in procs if _alive(p))
    marker = owner_tag().encode()
    proc_dir = Path("/proc")
    if proc_dir.is_dir():
        for entry in proc_dir.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
                if marker not in cmdline.split(b"\0"):
                    continue
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            state = stat.rsplit(")", 1)[-1].split()[0:1]
            if state != ["Z"]:
                pids.add(int(entry.name))
    return sorted(pids)


def signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    """Send ``sig`` to the process group of ``proc`` unless it has exited."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def terminate_all(procs: Sequence[subprocess.Popen[bytes]], timeout: float) -> list[int]:
    """SIGTERM every process group at once, SIGKILL what is left after ``timeout``.

    Returns the pids that had to be SIGKILLed. Never raises; interrupted by Ctrl-C it
    SIGKILLs at once and re-raises.
    """
    live = [p for p in procs if _alive(p)]
    for proc in live:  # a stopped JVM cannot act on SIGTERM
        signal_group(proc, signal.SIGCONT)
        signal_group(proc, signal.SIGTERM)
    killed: list[int] = []
    try:
        deadline = time.monotonic() + timeout
        while any(_alive(p) for p in live) and time.monotonic() < deadline:
            time.sleep(0.1)
    except BaseException:
        for proc in live:
            signal_group(proc, signal.SIGKILL)
        raise
    finally:
        for proc in live:
            if _alive(proc):
                killed.append(proc.pid)
                signal_group(proc, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
    return killed


def stop_unclosed(procs: list[subprocess.Popen[bytes]], owner_pid: int) -> None:
    """The finalizer of a cluster that was never closed: stop its JVMs (owner process only)."""
    if os.getpid() != owner_pid:  # a forked child inherited the list: not its JVMs
        return
    if any(_alive(p) for p in procs):
        logger.warning("KafkaCluster was not closed: stopping its %d node(s)", len(procs))
        terminate_all(procs, timeout=10.0)


def terminate_registered(timeout: float) -> list[int]:
    """`terminate_all` over every JVM this process started (the test session's last resort)."""
    with _ALL_PROCS_LOCK:
        procs = list(_ALL_PROCS.values())
    return terminate_all(procs, timeout)


def owner_tag() -> str:
    """The JVM option that tags a JVM as started by this process (see `leaked_kafka_jvms`)."""
    return f"-D{_OWNER_PROPERTY}={os.getpid()}"


def spawn(argv: Sequence[str], *, console: Path, cwd: Path) -> subprocess.Popen[bytes]:
    """Start ``argv`` in its own process group with stdout and stderr to ``console``.

    The process is registered for `leaked_kafka_jvms`, and on Linux dies with the calling
    thread when that is the main thread. Put `owner_tag` in ``argv`` for the ``/proc`` scan.
    """
    preexec = None
    if _prctl is not None and threading.current_thread() is threading.main_thread():
        preexec = _die_with_parent
    with console.open("wb") as out:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            start_new_session=True,  # own process group; Ctrl-C is the test run's to handle
            preexec_fn=preexec,
        )
    with _ALL_PROCS_LOCK:
        _ALL_PROCS[proc.pid] = proc
    return proc


def forget_exited(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """Drop the exited ones of ``procs`` from the registry (a closed cluster's nodes)."""
    with _ALL_PROCS_LOCK:
        for proc in procs:
            if not _alive(proc):
                _ALL_PROCS.pop(proc.pid, None)
