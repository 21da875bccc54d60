"""pytest fixtures for apps that use flask-quota (registered through the ``pytest11``
entry point, so they need no import):

- ``quota_clock``: a ``FrozenClock`` at a fixed start time;
- ``quota_storage``: a ``MemoryStorage`` deciding on ``quota_clock``, for
  ``Quota(app, storage=quota_storage)``.
"""

from __future__ import annotations

import pytest

from .storage import MemoryStorage
from .testing import FrozenClock

__all__ = ["quota_clock", "quota_storage"]


@pytest.fixture
def quota_clock() -> FrozenClock:
    """A clock that moves only with ``quota_clock.advance(seconds)``."""
    return FrozenClock()


@pytest.fixture
def quota_storage(quota_clock: FrozenClock) -> MemoryStorage:
    """An exact in-process backend on ``quota_clock``."""
    return MemoryStorage(quota_clock)
