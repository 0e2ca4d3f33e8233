"""The distribution: metadata, sdist contents, the [spark] extra's import error, and a wheel
installed into fresh virtual environments at both ends of the supported confluent-kafka range.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import textwrap
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

from consumer_sdk._version import __version__
from consumer_sdk.testing._mock_child import MIN_CONFLUENT_KAFKA

ROOT = Path(__file__).resolve().parent.parent
DIST = "kip848-consumer"
PIP_TIMEOUT_S = 600


def _pyproject() -> dict[str, object]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def _run(cmd: list[str], cwd: Path, timeout: float = PIP_TIMEOUT_S) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    result = subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert result.returncode == 0, (
        f"{' '.join(cmd)} exited {result.returncode}\n{result.stdout[-4000:]}\n"
        f"{result.stderr[-4000:]}"
    )
    return result.stdout


def test_metadata_names_our_own_distribution_and_ranges() -> None:
    project = _pyproject()["project"]
    assert isinstance(project, dict)
    assert project["name"] == DIST
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    assert "Apache License" in (ROOT / "LICENSE").read_text()
    deps = {re.split(r"[<>=!~ ]", d, maxsplit=1)[0]: d for d in project["dependencies"]}
    assert not [d for d in deps.values() if "==" in d], "exact pins make the SDK uninstallable"
    # The runtime check in EmbeddedKafka and the declared lower bound agree.
    assert f">={MIN_CONFLUENT_KAFKA}" in deps["confluent-kafka"]


def test_import_spark_integration_without_the_extra_names_it() -> None:
    blocker = textwrap.dedent(
        """
        import sys

        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("pyspark", "pyarrow"):
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
                return None

        sys.meta_path.insert(0, Block())
        try:
            import spark_integration
        except ImportError as exc:
            print("IMPORT-ERROR:", exc)
        else:
            print("imported")
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", blocker], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert "IMPORT-ERROR:" in out, out
    assert "[spark]" in out and "pyspark" in out and "pyarrow" in out, out


def test_embedded_kafka_names_missing_mock_functions_and_the_release_to_install() -> None:
    import _ctypes

    from consumer_sdk.testing import EmbeddedKafka, EmbeddedKafkaError

    # A real shared object that is not librdkafka: every mock-cluster function is missing.
    with pytest.raises(EmbeddedKafkaError) as error:
        EmbeddedKafka(librdkafka_path=_ctypes.__file__)
    message = str(error.value)
    assert "rd_kafka_mock_cluster_new" in message, message
    assert "rd_kafka_mock_topic_delete" not in message, "optional symbols are not required"
    assert f"install confluent-kafka>={MIN_CONFLUENT_KAFKA}" in message, message


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """An sdist and a wheel built from a clean copy of the checkout (no ignored files)."""
    base = tmp_path_factory.mktemp("dists")
    src = base / "src"
    git = shutil.which("git")
    if git and (ROOT / ".git").exists():
        files = (
            subprocess.run(
                [git, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                cwd=ROOT,
                capture_output=True,
                check=True,
            )
            .stdout.decode()
            .split("\0")
        )
        for name in filter(None, files):
            if (ROOT / name).is_file():
                (src / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / name, src / name)
    else:  # an unpacked sdist: it is the clean tree
        shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".venv", "site", "*.egg-info"))
    out = base / "dist"
    _run([sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", str(out)], cwd=src)
    (sdist,) = out.glob("*.tar.gz")
    (wheel,) = out.glob("*.whl")
    return {"sdist": sdist, "wheel": wheel}


@pytest.mark.slow
def test_sdist_carries_tests_docs_and_license(dists: dict[str, Path]) -> None:
    with tarfile.open(dists["sdist"]) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    for required in (
        "LICENSE",
        "README.md",
        "mkdocs.yml",
        "pyproject.toml",
        "docs/index.md",
        "docs/migration.md",
        "tests/conftest.py",
        "tests/test_packaging.py",
        "consumer_sdk/testing/_mock_child.py",
        "spark_integration/py.typed",
    ):
        assert required in names, f"sdist lacks {required}"
    assert not [n for n in names if "__pycache__" in n]


@pytest.mark.slow
def test_wheel_metadata(dists: dict[str, Path]) -> None:
    wheel = dists["wheel"]
    assert wheel.name.startswith(f"kip848_consumer-{__version__}-")
    with zipfile.ZipFile(wheel) as zf:
        meta_name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = zf.read(meta_name).decode()
        names = zf.namelist()
    assert "Name: kip848-consumer" in meta
    assert "License-Expression: Apache-2.0" in meta
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "consumer_sdk/py.typed" in names and "consumer_sdk/testing/_mock_child.py" in names


PLUGIN_TEST = """
from consumer_sdk import Consumer, TopicPartition


def test_the_fixture_serves_a_group(embedded_kafka):
    embedded_kafka.create_topic("smoke", partitions=2)
    embedded_kafka.produce("smoke", [b"a", b"b", b"c"])
    consumer = Consumer({
        "bootstrap.servers": embedded_kafka.bootstrap_servers,
        "group.id": "smoke",
        "auto.offset.reset": "earliest",
    })
    try:
        consumer.subscribe(["smoke"])
        seen = set()
        for _ in range(300):
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                seen.add(msg.value())
            if len(seen) == 3:
                break
        assert seen == {b"a", b"b", b"c"}
        consumer.commit(asynchronous=False)
        # The methods that lean on the installed confluent-kafka (fetcher, librdkafka).
        assert consumer.cluster_id(10)
        metadata = consumer.list_topics("smoke", timeout=10)
        assert sorted(metadata.topics["smoke"].partitions) == [0, 1]
        low, high = consumer.get_watermark_offsets(TopicPartition("smoke", 0), timeout=10)
        assert 0 <= low <= high
        assert consumer.consumer_group_metadata()
        committed = consumer.committed([TopicPartition("smoke", 0), TopicPartition("smoke", 1)])
        # A partition the records did not go to has no commit (OFFSET_INVALID).
        assert sum(tp.offset for tp in committed if tp.offset >= 0) == 3
    finally:
        consumer.close()
"""


@pytest.mark.slow
@pytest.mark.parametrize("confluent_kafka", ["lowest", "newest"])
def test_wheel_in_a_fresh_venv(
    dists: dict[str, Path], tmp_path: Path, confluent_kafka: str
) -> None:
    env_dir = tmp_path / "venv"
    # No pip of its own (ensurepip costs seconds): this interpreter's pip installs into it
    # (`pip --python`), resolving against the new environment alone, as its own pip would.
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    requirement = (
        f"confluent-kafka=={MIN_CONFLUENT_KAFKA}"
        if confluent_kafka == "lowest"
        else "confluent-kafka"
    )
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "-q",
            "--disable-pip-version-check",
            # bytecode is written on first import instead (most modules are never imported)
            "--no-compile",
            str(dists["wheel"]),
            requirement,
            "pytest>=8",
            "pytest-timeout",
        ],
        cwd=tmp_path,
    )
    installed = _run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('confluent-kafka'))"],
        cwd=tmp_path,
    ).strip()
    print(f"{confluent_kafka}: confluent-kafka {installed}")
    if confluent_kafka == "lowest":
        assert installed == MIN_CONFLUENT_KAFKA

    cli = str(env_dir / "bin" / "consumer-sdk")
    assert _run([cli, "--version"], cwd=tmp_path).strip() == f"consumer-sdk {__version__}" + (
        f" ({DIST}, confluent-kafka {installed})"
    )
    demo = _run([cli, "demo", "--step", "0.3", "--members", "2"], cwd=tmp_path, timeout=300)
    assert "no record lost" in demo, demo[-3000:]

    (tmp_path / "test_smoke.py").write_text(PLUGIN_TEST)
    out = _run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_smoke.py"],
        cwd=tmp_path,
        timeout=300,
    )
    assert "1 passed" in out, out
