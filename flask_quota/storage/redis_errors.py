"""What redis-py and the socket raise when Redis cannot answer: the errors every Redis
backend and the Redis usage sink declare (``storage_errors``)."""

from __future__ import annotations

import redis
from redis.exceptions import RedisClusterException

__all__ = ["REDIS_ERRORS"]

# RedisClusterException is not a RedisError: the cluster client raises it when no
# startup node answers, or the slot map does not cover a key.
REDIS_ERRORS: tuple[type[BaseException], ...] = (redis.RedisError, RedisClusterException, OSError)
