"""Spark applications, a Spark Connect server and a standalone cluster as child processes.

Everything comes from pyspark's own distribution (``bin/spark-class``, ``bin/spark-submit``)
and binds to 127.0.0.1. Each helper kills what it started (its process group) on close.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parents[2]


def spark_env(**extra: str) -> dict[str, str]:
    """The environment of a Spark process: Java 17, 127.0.0.1, this interpreter."""
    env = dict(os.environ)
    java = shutil.which("java")
    if java is not None and "JAVA_HOME" not in env:
        env["JAVA_HOME"] = str(Path(os.path.realpath(java)).parent.parent)
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _kill(proc: subprocess.Popen[Any], timeout: float = 20.0) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


class App:
    """`tests.spark.spark_app` in its own process (its own Spark driver)."""

    def __init__(
        self, name: str, workdir: Path, *args: str, env: dict[str, str] | None = None
    ) -> None:
        self.name = name
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self._log = open(workdir / "app.log", "w")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.spark.spark_app",
                "--name",
                name,
                *self._args(workdir, args),
            ],
            cwd=REPO,
            env=env or spark_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            start_new_session=True,
        )
        self._lines: queue.Queue[str] = queue.Queue()
        assert self.proc.stdout is not None
        threading.Thread(target=self._pump, args=(self.proc.stdout,), daemon=True).start()

    @staticmethod
    def _args(workdir: Path, args: tuple[str, ...]) -> list[str]:
        return ["--workdir", str(workdir), *args]

    def _pump(self, out: IO[str]) -> None:
        for line in out:
            self._lines.put(line.rstrip("\n"))
        self._lines.put("eof")

    def expect(self, word: str, timeout: float = 240.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise AssertionError(f"{self.name}: no {word!r} in {timeout} s") from None
            if line.startswith("error "):
                raise AssertionError(f"{self.name}: {json.loads(line[6:])}")
            if line == "eof":
                tail = (self.workdir / "app.log").read_text()[-3000:]
                raise AssertionError(f"{self.name}: exited before {word!r}:\n{tail}")
            if line.split(" ", 1)[0] == word:
                return line

    def check(self) -> None:
        """Raise if the application reported an error (a failed query) or exited."""
        while True:
            try:
                line = self._lines.get_nowait()
            except queue.Empty:
                return
            if line.startswith("error ") or line == "eof":
                self._lines.put(line)
                self.expect("never")

    def command(self, word: str, answer: str, timeout: float = 240.0) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(word + "\n")
        self.proc.stdin.flush()
        return self.expect(answer, timeout)

    def start(self, trigger: str | None = None) -> None:
        """Start the query (``trigger``: ``once``, ``availableNow``; else processingTime)."""
        self.command(f"start {trigger}" if trigger else "start", "started")

    def stop(self) -> None:
        self.command("stop", "stopped")

    def events(self) -> list[dict[str, Any]]:
        path = self.workdir / "events.jsonl"
        if not path.exists():
            return []
        return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]

    def close(self) -> None:
        if self.proc.poll() is None and self.proc.stdin is not None:
            try:
                self.proc.stdin.write("exit\n")
                self.proc.stdin.flush()
                self.proc.wait(60)
            except (OSError, subprocess.TimeoutExpired):
                pass
        _kill(self.proc)
        self._log.close()


class SparkDaemon:
    """A JVM from pyspark's distribution (``bin/spark-class <main class> ...``)."""

    def __init__(
        self,
        log: Path,
        main_class: str,
        *args: str,
        submit: bool = False,
        env: dict[str, str] | None = None,
    ) -> None:
        home = spark_home()
        self._log = open(log, "w")  # noqa: SIM115 - closed in close()
        self.log = log
        command = (
            [str(home / "bin" / "spark-submit"), "--class", main_class, *args]
            if submit
            else [str(home / "bin" / "spark-class"), main_class, *args]
        )
        self.proc = subprocess.Popen(
            command,
            cwd=log.parent,
            env=spark_env(**{"SPARK_HOME": str(home), **(env or {})}),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_for_port(self, port: int, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return
            if self.proc.poll() is not None:
                raise AssertionError(f"exited: {self.log.read_text(errors='replace')[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"nothing listens on {port} after {timeout} s: {self.log}")
            time.sleep(0.2)

    def wait_for_log(self, text: str, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.log.read_text(errors="replace"):
            if self.proc.poll() is not None:
                raise AssertionError(f"exited: {self.log.read_text(errors='replace')[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {text!r} in {timeout} s: {self.log}")
            time.sleep(0.2)

    def close(self) -> None:
        _kill(self.proc)
        self._log.close()
