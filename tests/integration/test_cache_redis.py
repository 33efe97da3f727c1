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


async def test_older_generations_are_swept_once_and_nothing_else(redis_url: str) -> None:
    # A prefix with glob characters: unescaped, "[ab]" would also match the "a" prefix below.
    run = uuid.uuid4().hex
    cache = QueryCache(url=redis_url, prefix=f"ragline-test:{run}:[ab]*:")
    neighbour = QueryCache(url=redis_url, prefix=f"ragline-test:{run}:a*:")
    keys = {
        gen: [
            cache.key(f"question {i}", k=5, generation=gen, model_id="m", casefold=True)
            for i in range(3)
        ]
        for gen in (1, 2, 3, 12)
    }
    for names in keys.values():
        for name in names:
            await cache.put(name, [("c-1", 1.0, {})])
    theirs = neighbour.key("question 0", k=5, generation=1, model_id="m", casefold=True)
    await neighbour.put(theirs, [("c-9", 2.0, {})])

    assert await cache.drop_older(3) == 6  # generations 1 and 2
    assert await cache.drop_older(3) == 0  # already claimed: a replica does not repeat it
    client = redis.Redis.from_url(redis_url)
    assert not any(client.exists(name) for gen in (1, 2) for name in keys[gen])
    assert all(client.exists(name) for gen in (3, 12) for name in keys[gen])  # 12 > 3: kept
    assert client.exists(theirs)  # another prefix is never touched
    assert await cache.get(keys[3][0]) == [("c-1", 1.0, {})]
    assert cache.stats.swept == 6
    client.delete(*keys[3], *keys[12], theirs, f"{cache.prefix}sweep:g3")
    await cache.close()
    await neighbour.close()


async def test_a_sweep_with_redis_down_returns_quietly() -> None:
    cache = QueryCache(url="redis://127.0.0.1:1/0", timeout_s=0.05)
    started = time.perf_counter()
    assert await cache.drop_older(5) == 0
    assert time.perf_counter() - started < 1.0
    await cache.close()
