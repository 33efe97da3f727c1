"""Redis query cache: normalised query + retrieval settings + index generation → ranked ids.

Redis down or slow never fails a request: every call has a bounded timeout, errors are
counted and logged, and after an error the cache is skipped for a short cool-down so a dead
Redis costs at most one timeout per cool-down instead of one per request.

Keys name their index generation (``<prefix>g<generation>:<sha256>``): once an index moves to a
new generation its older entries can never be read again, and :meth:`QueryCache.drop_older`
deletes them instead of leaving them to their TTL (a 10-minute soak with an upload every 10 s
left ~3,300 dead keys a minute behind).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import time
from dataclasses import dataclass, field
from typing import Any

from ragline.text import lower_chars, query_text

logger = logging.getLogger(__name__)


def normalize_query(query: str, casefold: bool) -> str:
    """:func:`ragline.text.query_text` (NFKC, collapsed whitespace); lower-cased only when
    the encoders lower-case anyway, one character at a time as their tokenizers do
    (``str.casefold`` would make "ß" "ss", ``str.lower`` a final "Σ" "ς": other tokens). The
    retriever encodes the query as ``query_text`` gives it, so queries sharing a key are
    read the same: a key normalised further than what the encoders read let a full-width
    query's ranking be served for the ASCII one."""
    text = query_text(query)
    return lower_chars(text) if casefold else text


Ranked = list[tuple[str, float, dict[str, float]]]
"""A cached ranking: ``(chunk_id, score, stage_scores)``, best first."""

MAX_CACHED_HITS = 10_000
"""Hits a cached entry may hold at most (a request's ``k`` is far below it)."""


def _ranking(raw: bytes | str) -> Ranked:
    """A cached entry read back, every field checked: ValueError for anything that is not
    what :meth:`QueryCache.put` writes (Redis is shared: a key may hold anything)."""
    data = json.loads(raw)
    if not isinstance(data, list) or len(data) > MAX_CACHED_HITS:
        raise ValueError("not a list of hits")
    out: Ranked = []
    for item in data:
        if not (isinstance(item, list) and len(item) == 3):
            raise ValueError("a hit is not [chunk id, score, stage scores]")
        chunk_id, score, stages = item
        if not isinstance(chunk_id, str) or not isinstance(stages, dict):
            raise ValueError("a hit's chunk id or stage scores have the wrong type")
        values = [score, *stages.values()]
        if not all(
            isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
            for v in values
        ):
            raise ValueError("a score is not a finite number")
        out.append((chunk_id, float(score), {str(n): float(v) for n, v in stages.items()}))
    return out


@dataclass(slots=True)
class CacheStats:
    hits: int = 0
    misses: int = 0
    errors: int = 0
    skipped: int = 0
    """Lookups not attempted because the cache was cooling down after an error."""
    swept: int = 0
    """Keys of older index generations deleted by :meth:`QueryCache.drop_older`."""


def _glob_escape(text: str) -> str:
    """``text`` as a literal inside a Redis ``MATCH`` pattern."""
    return re.sub(r"([\\*?\[\]])", r"\\\1", text)


@dataclass(slots=True)
class QueryCache:
    """Async Redis cache with a connection pool. ``url=None`` or ``enabled=False`` turns it off."""

    url: str
    ttl_s: int = 3600
    timeout_s: float = 0.05
    cooldown_s: float = 2.0
    prefix: str = "ragline:q:"
    enabled: bool = True
    stats: CacheStats = field(default_factory=CacheStats)
    _client: Any = None
    _down_until: float = 0.0

    def key(
        self,
        query: str,
        *,
        k: int,
        generation: int,
        model_id: str,
        casefold: bool,
        options: dict[str, Any] | None = None,
        snapshot: str = "",
    ) -> str:
        """The hash of everything that decides the ranking: normalised query, k, the search
        options (mode, fusion, weights, filters), the model ids, the index generation and
        the write that made it (``snapshot``: a copied index that diverged reaches the same
        generation with other content)."""
        payload = json.dumps(
            {
                "q": normalize_query(query, casefold),
                "k": k,
                "gen": generation,
                "snap": snapshot,
                "model": model_id,
                "opt": options or {},
                "v": 3,
            },
            sort_keys=True,
        )
        return f"{self.prefix}g{generation}:{hashlib.sha256(payload.encode()).hexdigest()}"

    def _redis(self) -> Any:
        if self._client is None:
            import redis.asyncio as redis

            self._client = redis.Redis.from_url(
                self.url,
                socket_timeout=self.timeout_s,
                socket_connect_timeout=self.timeout_s,
                retry_on_timeout=False,
                max_connections=64,
            )
        return self._client

    def _available(self) -> bool:
        if not self.enabled:
            return False
        if time.monotonic() < self._down_until:
            self.stats.skipped += 1
            return False
        return True

    def _failed(self, op: str, exc: Exception) -> None:
        self.stats.errors += 1
        self._down_until = time.monotonic() + self.cooldown_s
        logger.warning("query cache %s failed, serving uncached: %s", op, exc)

    async def get(self, key: str) -> Ranked | None:
        """Ranked ``(chunk_id, score, stage_scores)``, or None on a miss, a Redis problem or
        an entry that is not a ranking (counted as an error and logged; the caller's search
        then writes a good one over it)."""
        if not self._available():
            return None
        try:
            raw = await self._redis().get(key)
        except Exception as exc:  # any Redis/socket error: serve uncached
            self._failed("get", exc)
            return None
        if raw is None:
            self.stats.misses += 1
            return None
        try:
            ranked = _ranking(raw)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError too
            self.stats.errors += 1
            logger.warning("query cache entry %s is not a ranking, serving uncached: %s", key, exc)
            return None
        self.stats.hits += 1
        return ranked

    async def put(self, key: str, ranked: Ranked) -> None:
        if not self._available():
            return
        try:
            await self._redis().set(key, json.dumps(ranked), ex=self.ttl_s)
        except Exception as exc:
            self._failed("set", exc)

    async def drop_older(self, generation: int, batch: int = 500) -> int:
        """Delete this prefix's keys of generations before ``generation`` (SCAN, then UNLINK in
        batches); returns how many went. One process sweeps per generation (a short Redis
        lock), so replicas sharing the cache do not repeat it. Never raises: a failed sweep is
        logged and leaves the rest to the TTL. Indexes that share one Redis need their own
        prefixes (``RAGLINE_CACHE_KEY_PREFIX``), as their generations are not comparable."""
        # not _available(): that counts skipped lookups, and a sweep is none
        if not self.enabled or time.monotonic() < self._down_until or generation <= 0:
            return 0
        client = self._redis()
        dropped = 0
        try:
            claimed = await client.set(f"{self.prefix}sweep:g{generation}", 1, nx=True, ex=60)
            if not claimed:
                return 0
            doomed: list[bytes] = []
            head = len(self.prefix) + 1
            async for raw in client.scan_iter(match=_glob_escape(self.prefix) + "g*", count=1000):
                name = raw.decode() if isinstance(raw, bytes) else str(raw)
                number = name[head:].split(":", 1)[0]
                if number.isdigit() and int(number) < generation:
                    doomed.append(raw)
                if len(doomed) >= batch:
                    dropped += int(await client.unlink(*doomed))
                    doomed.clear()
            if doomed:
                dropped += int(await client.unlink(*doomed))
        except Exception as exc:  # a sweep is housekeeping: the TTL still bounds the keys
            logger.warning("query cache sweep of generations < %d stopped: %s", generation, exc)
        self.stats.swept += dropped
        return dropped

    async def ping(self) -> bool:
        try:
            return bool(await self._redis().ping())
        except Exception:
            return False

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
