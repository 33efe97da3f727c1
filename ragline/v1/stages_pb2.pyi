from ragline.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SearchRequest(_message.Message):
    __slots__ = ("query", "k", "bypass_cache", "options")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    BYPASS_CACHE_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    query: str
    k: int
    bypass_cache: bool
    options: _common_pb2.SearchOptions
    def __init__(self, query: _Optional[str] = ..., k: _Optional[int] = ..., bypass_cache: _Optional[bool] = ..., options: _Optional[_Union[_common_pb2.SearchOptions, _Mapping]] = ...) -> None: ...

class SearchResponse(_message.Message):
    __slots__ = ("hits", "cache_hit", "index_generation", "timings_ms")
    class TimingsMsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    HITS_FIELD_NUMBER: _ClassVar[int]
    CACHE_HIT_FIELD_NUMBER: _ClassVar[int]
    INDEX_GENERATION_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_MS_FIELD_NUMBER: _ClassVar[int]
    hits: _containers.RepeatedCompositeFieldContainer[_common_pb2.Hit]
    cache_hit: bool
    index_generation: int
    timings_ms: _containers.ScalarMap[str, float]
    def __init__(self, hits: _Optional[_Iterable[_Union[_common_pb2.Hit, _Mapping]]] = ..., cache_hit: _Optional[bool] = ..., index_generation: _Optional[int] = ..., timings_ms: _Optional[_Mapping[str, float]] = ...) -> None: ...

class ScoreRequest(_message.Message):
    __slots__ = ("query", "hits", "threshold")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    query: str
    hits: _containers.RepeatedCompositeFieldContainer[_common_pb2.Hit]
    threshold: float
    def __init__(self, query: _Optional[str] = ..., hits: _Optional[_Iterable[_Union[_common_pb2.Hit, _Mapping]]] = ..., threshold: _Optional[float] = ...) -> None: ...

class ScoreResponse(_message.Message):
    __slots__ = ("scores", "kept", "timings_ms", "threshold")
    class TimingsMsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    SCORES_FIELD_NUMBER: _ClassVar[int]
    KEPT_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_MS_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    scores: _containers.RepeatedScalarFieldContainer[float]
    kept: _containers.RepeatedScalarFieldContainer[bool]
    timings_ms: _containers.ScalarMap[str, float]
    threshold: float
    def __init__(self, scores: _Optional[_Iterable[float]] = ..., kept: _Optional[_Iterable[bool]] = ..., timings_ms: _Optional[_Mapping[str, float]] = ..., threshold: _Optional[float] = ...) -> None: ...

class ExpandRequest(_message.Message):
    __slots__ = ("query", "hits", "k")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    query: str
    hits: _containers.RepeatedCompositeFieldContainer[_common_pb2.Hit]
    k: int
    def __init__(self, query: _Optional[str] = ..., hits: _Optional[_Iterable[_Union[_common_pb2.Hit, _Mapping]]] = ..., k: _Optional[int] = ...) -> None: ...

class ExpandResponse(_message.Message):
    __slots__ = ("hits", "graph_used")
    HITS_FIELD_NUMBER: _ClassVar[int]
    GRAPH_USED_FIELD_NUMBER: _ClassVar[int]
    hits: _containers.RepeatedCompositeFieldContainer[_common_pb2.Hit]
    graph_used: bool
    def __init__(self, hits: _Optional[_Iterable[_Union[_common_pb2.Hit, _Mapping]]] = ..., graph_used: _Optional[bool] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("query", "evidence", "max_new_tokens")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    query: str
    evidence: _containers.RepeatedCompositeFieldContainer[_common_pb2.Hit]
    max_new_tokens: int
    def __init__(self, query: _Optional[str] = ..., evidence: _Optional[_Iterable[_Union[_common_pb2.Hit, _Mapping]]] = ..., max_new_tokens: _Optional[int] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("answer", "insufficient", "reason", "citations", "timings_ms")
    class TimingsMsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    INSUFFICIENT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CITATIONS_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_MS_FIELD_NUMBER: _ClassVar[int]
    answer: str
    insufficient: bool
    reason: str
    citations: _containers.RepeatedCompositeFieldContainer[_common_pb2.Citation]
    timings_ms: _containers.ScalarMap[str, float]
    def __init__(self, answer: _Optional[str] = ..., insufficient: _Optional[bool] = ..., reason: _Optional[str] = ..., citations: _Optional[_Iterable[_Union[_common_pb2.Citation, _Mapping]]] = ..., timings_ms: _Optional[_Mapping[str, float]] = ...) -> None: ...

class GenerateStreamResponse(_message.Message):
    __slots__ = ("delta", "final")
    DELTA_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    delta: str
    final: GenerateResponse
    def __init__(self, delta: _Optional[str] = ..., final: _Optional[_Union[GenerateResponse, _Mapping]] = ...) -> None: ...
