"""Fixtures of the engine tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory):
    """A local Ray for the module (2 CPUs, no dashboard), stopped at its end; never another address.

    Yields the workers' cache folder (``XDG_CACHE_HOME``: ``<it>/pcd`` holds what pcd keeps per
    machine, e.g. the bfloat16 measurement), a fresh one, not the user's."""
    ray = pytest.importorskip("ray")
    assert not ray.is_initialized()
    cache = tmp_path_factory.mktemp("ray-workers-cache")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"XDG_CACHE_HOME": str(cache)}})
    yield cache
    ray.shutdown()
