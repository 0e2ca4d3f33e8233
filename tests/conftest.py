"""Suite-wide settings: reproducible property tests in CI."""

from __future__ import annotations

import os

from hypothesis import settings

# Loop-thread-only runtime code asserts its thread (here and in child processes).
os.environ["CONSUMER_SDK_CHECK_THREADS"] = "1"

# pytester runs a child pytest (tests/realkafka: a leaked KafkaCluster fails the session)
pytest_plugins = ["pytester"]

# In CI every run draws the same examples (a failure there replays locally with CI=true);
# locally, examples vary from run to run and the example database remembers failures.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
    settings.load_profile("ci")
