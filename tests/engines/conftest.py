"""Fixtures of the engine tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray for the module (2 CPUs, no dashboard), stopped at its end; never another address."""
    ray = pytest.importorskip("ray")
    assert not ray.is_initialized()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
