from __future__ import annotations

import time
import uuid

import pytest
import redis

from retriever.cache import QueryCache

pytestmark = pytest.mark.integration


async def test_put_get_with_ttl_on_real_redis(redis_url: str) -> None:
    cache = QueryCache(url=redis_url, ttl_s=3600, prefix=f"ragline-test:{uuid.uuid4().hex}:")
    key = cache.key("what is x?", k=5, generation=1, model_id="m", casefold=True)
    assert await cache.get(key) is None
    await cache.put(key, [("c-1", 3.5, {"sparse": 3.5}), ("c-2", 1.25, {})])
    assert await cache.get(key) == [("c-1", 3.5, {"sparse": 3.5}), ("c-2", 1.25, {})]
    ttl = redis.Redis.from_url(redis_url).ttl(key)
    assert 3590 <= ttl <= 3600
    assert (cache.stats.hits, cache.stats.misses, cache.stats.errors) == (1, 1, 0)
    await cache.close()


async def test_redis_down_is_bounded_counted_and_cooled_down() -> None:
    # Nothing listens on port 1: every call fails fast; the cache must not raise.
    cache = QueryCache(url="redis://127.0.0.1:1/0", timeout_s=0.05, cooldown_s=30)
    key = cache.key("q", k=5, generation=1, model_id="m", casefold=True)
    started = time.perf_counter()
    assert await cache.get(key) is None
    await cache.put(key, [("c", 1.0, {})])
    assert await cache.get(key) is None
    assert time.perf_counter() - started < 1.0
    assert cache.stats.errors == 1  # later calls skip Redis during the cool-down
    assert cache.stats.skipped == 2
    await cache.close()
