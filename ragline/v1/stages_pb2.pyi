from ragline.v1 import common_pb2 as _common_pb2
from ragline.v1 import ragline_pb2 as _ragline_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CollectionGrant(_message.Message):
    __slots__ = ("all", "collections")
    ALL_FIELD_NUMBER: _ClassVar[int]
    COLLECTIONS_FIELD_NUMBER: _ClassVar[int]
    all: bool
    collections: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, all: _Optional[bool] = ..., collections: _Optional[_Iterable[str]] = ...) -> None: ...

class IndexIngestRequest(_message.Message):
    __slots__ = ("request", "grant")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    GRANT_FIELD_NUMBER: _ClassVar[int]
    request: _ragline_pb2.IngestRequest
    grant: CollectionGrant
    def __init__(self, request: _Optional[_Union[_ragline_pb2.IngestRequest, _Mapping]] = ..., grant: _Optional[_Union[CollectionGrant, _Mapping]] = ...) -> None: ...

class IndexDeleteRequest(_message.Message):
    __slots__ = ("request", "grant")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    GRANT_FIELD_NUMBER: _ClassVar[int]
    request: _ragline_pb2.DeleteDocumentRequest
    grant: CollectionGrant
    def __init__(self, request: _Optional[_Union[_ragline_pb2.DeleteDocumentRequest, _Mapping]] = ..., grant: _Optional[_Union[CollectionGrant, _Mapping]] = ...) -> None: ...

class DescribeRequest(_message.Message):
    __slots__ = ("doc_ids",)
    DOC_IDS_FIELD_NUMBER: _ClassVar[int]
    doc_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, doc_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class CollectionSize(_message.Message):
    __slots__ = ("documents", "chunks")
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    documents: int
    chunks: int
    def __init__(self, documents: _Optional[int] = ..., chunks: _Optional[int] = ...) -> None: ...

class DescribeResponse(_message.Message):
    __slots__ = ("index_generation", "chunks", "collections", "doc_collections", "models", "counters", "dense")
    class CollectionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: CollectionSize
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[CollectionSize, _Mapping]] = ...) -> None: ...
    class DocCollectionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class ModelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class CountersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    INDEX_GENERATION_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    COLLECTIONS_FIELD_NUMBER: _ClassVar[int]
    DOC_COLLECTIONS_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    DENSE_FIELD_NUMBER: _ClassVar[int]
    index_generation: int
    chunks: int
    collections: _containers.MessageMap[str, CollectionSize]
    doc_collections: _containers.ScalarMap[str, str]
    models: _containers.ScalarMap[str, str]
    counters: _containers.ScalarMap[str, float]
    dense: bool
    def __init__(self, index_generation: _Optional[int] = ..., chunks: _Optional[int] = ..., collections: _Optional[_Mapping[str, CollectionSize]] = ..., doc_collections: _Optional[_Mapping[str, str]] = ..., models: _Optional[_Mapping[str, str]] = ..., counters: _Optional[_Mapping[str, float]] = ..., dense: _Optional[bool] = ...) -> None: ...

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
    __slots__ = ("scores", "kept", "timings_ms", "threshold", "filter")
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
    FILTER_FIELD_NUMBER: _ClassVar[int]
    scores: _containers.RepeatedScalarFieldContainer[float]
    kept: _containers.RepeatedScalarFieldContainer[bool]
    timings_ms: _containers.ScalarMap[str, float]
    threshold: float
    filter: str
    def __init__(self, scores: _Optional[_Iterable[float]] = ..., kept: _Optional[_Iterable[bool]] = ..., timings_ms: _Optional[_Mapping[str, float]] = ..., threshold: _Optional[float] = ..., filter: _Optional[str] = ...) -> None: ...

class ExpandRequest(_message.Message):
    __slots__ = ("query", "hits", "k", "options", "append")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    APPEND_FIELD_NUMBER: _ClassVar[int]
    query: str
    hits: _containers.RepeatedCompositeFieldContainer[_common_pb2.Hit]
    k: int
    options: _common_pb2.SearchOptions
    append: bool
    def __init__(self, query: _Optional[str] = ..., hits: _Optional[_Iterable[_Union[_common_pb2.Hit, _Mapping]]] = ..., k: _Optional[int] = ..., options: _Optional[_Union[_common_pb2.SearchOptions, _Mapping]] = ..., append: _Optional[bool] = ...) -> None: ...

class ExpandResponse(_message.Message):
    __slots__ = ("hits", "graph_used", "timings_ms")
    class TimingsMsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    HITS_FIELD_NUMBER: _ClassVar[int]
    GRAPH_USED_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_MS_FIELD_NUMBER: _ClassVar[int]
    hits: _containers.RepeatedCompositeFieldContainer[_common_pb2.Hit]
    graph_used: bool
    timings_ms: _containers.ScalarMap[str, float]
    def __init__(self, hits: _Optional[_Iterable[_Union[_common_pb2.Hit, _Mapping]]] = ..., graph_used: _Optional[bool] = ..., timings_ms: _Optional[_Mapping[str, float]] = ...) -> None: ...

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
