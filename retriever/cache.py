"""Redis query cache: normalised query + retrieval settings + index generation → ranked ids.

Redis down or slow never fails a request: every call has a bounded timeout, errors are
counted and logged, and after an error the cache is skipped for a short cool-down so a dead
Redis costs at most one timeout per cool-down instead of one per request.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
import unicodedata
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

_SPACES = re.compile(r"\s+")


def normalize_query(query: str, casefold: bool) -> str:
    """NFKC, collapsed whitespace; case-folded only when the encoder ignores case anyway."""
    text = _SPACES.sub(" ", unicodedata.normalize("NFKC", query)).strip()
    return text.casefold() if casefold else text


@dataclass(slots=True)
class CacheStats:
    hits: int = 0
    misses: int = 0
    errors: int = 0
    skipped: int = 0
    """Lookups not attempted because the cache was cooling down after an error."""


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
    ) -> str:
        """The hash of everything that decides the ranking: normalised query, k, the search
        options (mode, fusion, weights, filters), the model ids and the index generation."""
        payload = json.dumps(
            {
                "q": normalize_query(query, casefold),
                "k": k,
                "gen": generation,
                "model": model_id,
                "opt": options or {},
                "v": 2,
            },
            sort_keys=True,
        )
        return self.prefix + hashlib.sha256(payload.encode()).hexdigest()

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

    async def get(self, key: str) -> list[tuple[str, float, dict[str, float]]] | None:
        """Ranked ``(chunk_id, score, stage_scores)``, or None on a miss or a Redis problem."""
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
        self.stats.hits += 1
        return [(str(cid), float(score), dict(stages)) for cid, score, stages in json.loads(raw)]

    async def put(self, key: str, ranked: list[tuple[str, float, dict[str, float]]]) -> None:
        if not self._available():
            return
        try:
            await self._redis().set(key, json.dumps(ranked), ex=self.ttl_s)
        except Exception as exc:
            self._failed("set", exc)

    async def ping(self) -> bool:
        try:
            return bool(await self._redis().ping())
        except Exception:
            return False

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
