"""Shared fixtures. Vulkan runs on whatever device is present (lavapipe in CI) with the
validation layer on: any validation error fails the test that caused it."""
import pytest

from worker.config import Settings


@pytest.fixture(scope="session")
def vk_settings(tmp_path_factory):
    return Settings(validation=True, cache_dir=tmp_path_factory.getbasetemp() / "vkcache")


@pytest.fixture(scope="session")
def vk_session(vk_settings):
    from worker.vk import Context
    ctx = Context(vk_settings, block_size=64 << 20)
    yield ctx
    ctx.close()


@pytest.fixture
def vk_ctx(vk_session):
    """The session's Vulkan context; fails the test on any validation error it caused."""
    log = vk_session.validation
    before = len(log.errors)
    yield vk_session
    assert log.errors[before:] == [], "Vulkan validation errors"
