"""Make the EmbeddedKafka fixtures available even when kip848-consumer is not pip-installed.

Once installed, the ``pytest11`` entry point registers the plugin; registering the same
module again would fail, so only register it when it is missing.
"""

from __future__ import annotations

import pytest

from consumer_sdk.testing import pytest_plugin


def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.is_registered(pytest_plugin):
        config.pluginmanager.register(pytest_plugin, "consumer_sdk_embedded_kafka")
