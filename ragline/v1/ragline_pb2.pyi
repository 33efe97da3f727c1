from ragline.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Document(_message.Message):
    __slots__ = ("name", "content")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    name: str
    content: bytes
    def __init__(self, name: _Optional[str] = ..., content: _Optional[bytes] = ...) -> None: ...

class IngestRequest(_message.Message):
    __slots__ = ("paths", "documents", "collection", "replace_other_paths")
    PATHS_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    REPLACE_OTHER_PATHS_FIELD_NUMBER: _ClassVar[int]
    paths: _containers.RepeatedScalarFieldContainer[str]
    documents: _containers.RepeatedCompositeFieldContainer[Document]
    collection: str
    replace_other_paths: bool
    def __init__(self, paths: _Optional[_Iterable[str]] = ..., documents: _Optional[_Iterable[_Union[Document, _Mapping]]] = ..., collection: _Optional[str] = ..., replace_other_paths: _Optional[bool] = ...) -> None: ...

class IngestFileResult(_message.Message):
    __slots__ = ("source", "doc_id", "status", "reason", "pages", "chunks", "tables", "ocr_pages", "pages_left_out", "running_lines_removed")
    class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATUS_UNSPECIFIED: _ClassVar[IngestFileResult.Status]
        INGESTED: _ClassVar[IngestFileResult.Status]
        UNCHANGED: _ClassVar[IngestFileResult.Status]
        REPLACED: _ClassVar[IngestFileResult.Status]
        FAILED: _ClassVar[IngestFileResult.Status]
    STATUS_UNSPECIFIED: IngestFileResult.Status
    INGESTED: IngestFileResult.Status
    UNCHANGED: IngestFileResult.Status
    REPLACED: IngestFileResult.Status
    FAILED: IngestFileResult.Status
    class PagesLeftOutEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: str
        def __init__(self, key: _Optional[int] = ..., value: _Optional[str] = ...) -> None: ...
    class RemovedLine(_message.Message):
        __slots__ = ("text", "pages")
        TEXT_FIELD_NUMBER: _ClassVar[int]
        PAGES_FIELD_NUMBER: _ClassVar[int]
        text: str
        pages: int
        def __init__(self, text: _Optional[str] = ..., pages: _Optional[int] = ...) -> None: ...
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PAGES_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    OCR_PAGES_FIELD_NUMBER: _ClassVar[int]
    PAGES_LEFT_OUT_FIELD_NUMBER: _ClassVar[int]
    RUNNING_LINES_REMOVED_FIELD_NUMBER: _ClassVar[int]
    source: str
    doc_id: str
    status: IngestFileResult.Status
    reason: str
    pages: int
    chunks: int
    tables: int
    ocr_pages: _containers.RepeatedScalarFieldContainer[int]
    pages_left_out: _containers.ScalarMap[int, str]
    running_lines_removed: _containers.RepeatedCompositeFieldContainer[IngestFileResult.RemovedLine]
    def __init__(self, source: _Optional[str] = ..., doc_id: _Optional[str] = ..., status: _Optional[_Union[IngestFileResult.Status, str]] = ..., reason: _Optional[str] = ..., pages: _Optional[int] = ..., chunks: _Optional[int] = ..., tables: _Optional[int] = ..., ocr_pages: _Optional[_Iterable[int]] = ..., pages_left_out: _Optional[_Mapping[int, str]] = ..., running_lines_removed: _Optional[_Iterable[_Union[IngestFileResult.RemovedLine, _Mapping]]] = ...) -> None: ...

class IngestResponse(_message.Message):
    __slots__ = ("results", "index_generation", "chunks_total")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    INDEX_GENERATION_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[IngestFileResult]
    index_generation: int
    chunks_total: int
    def __init__(self, results: _Optional[_Iterable[_Union[IngestFileResult, _Mapping]]] = ..., index_generation: _Optional[int] = ..., chunks_total: _Optional[int] = ...) -> None: ...

class RetrieveRequest(_message.Message):
    __slots__ = ("query", "k", "bypass_cache", "options", "score_evidence")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    BYPASS_CACHE_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    SCORE_EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    query: str
    k: int
    bypass_cache: bool
    options: _common_pb2.SearchOptions
    score_evidence: bool
    def __init__(self, query: _Optional[str] = ..., k: _Optional[int] = ..., bypass_cache: _Optional[bool] = ..., options: _Optional[_Union[_common_pb2.SearchOptions, _Mapping]] = ..., score_evidence: _Optional[bool] = ...) -> None: ...

class RetrieveResponse(_message.Message):
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

class AnswerRequest(_message.Message):
    __slots__ = ("query", "k", "max_new_tokens", "threshold", "options")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    query: str
    k: int
    max_new_tokens: int
    threshold: float
    options: _common_pb2.SearchOptions
    def __init__(self, query: _Optional[str] = ..., k: _Optional[int] = ..., max_new_tokens: _Optional[int] = ..., threshold: _Optional[float] = ..., options: _Optional[_Union[_common_pb2.SearchOptions, _Mapping]] = ...) -> None: ...

class AnswerResponse(_message.Message):
    __slots__ = ("answer", "insufficient", "reason", "citations", "evidence", "timings_ms")
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
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_MS_FIELD_NUMBER: _ClassVar[int]
    answer: str
    insufficient: bool
    reason: str
    citations: _containers.RepeatedCompositeFieldContainer[_common_pb2.Citation]
    evidence: _containers.RepeatedCompositeFieldContainer[_common_pb2.Hit]
    timings_ms: _containers.ScalarMap[str, float]
    def __init__(self, answer: _Optional[str] = ..., insufficient: _Optional[bool] = ..., reason: _Optional[str] = ..., citations: _Optional[_Iterable[_Union[_common_pb2.Citation, _Mapping]]] = ..., evidence: _Optional[_Iterable[_Union[_common_pb2.Hit, _Mapping]]] = ..., timings_ms: _Optional[_Mapping[str, float]] = ...) -> None: ...

class AnswerStreamResponse(_message.Message):
    __slots__ = ("delta", "final")
    DELTA_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    delta: str
    final: AnswerResponse
    def __init__(self, delta: _Optional[str] = ..., final: _Optional[_Union[AnswerResponse, _Mapping]] = ...) -> None: ...

class DeleteDocumentRequest(_message.Message):
    __slots__ = ("doc_id", "collection")
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    doc_id: str
    collection: str
    def __init__(self, doc_id: _Optional[str] = ..., collection: _Optional[str] = ...) -> None: ...

class DeleteDocumentResponse(_message.Message):
    __slots__ = ("chunks_removed", "index_generation")
    CHUNKS_REMOVED_FIELD_NUMBER: _ClassVar[int]
    INDEX_GENERATION_FIELD_NUMBER: _ClassVar[int]
    chunks_removed: int
    index_generation: int
    def __init__(self, chunks_removed: _Optional[int] = ..., index_generation: _Optional[int] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetStatsResponse(_message.Message):
    __slots__ = ("documents", "chunks", "index_generation", "models", "counters")
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
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    INDEX_GENERATION_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    documents: int
    chunks: int
    index_generation: int
    models: _containers.ScalarMap[str, str]
    counters: _containers.ScalarMap[str, float]
    def __init__(self, documents: _Optional[int] = ..., chunks: _Optional[int] = ..., index_generation: _Optional[int] = ..., models: _Optional[_Mapping[str, str]] = ..., counters: _Optional[_Mapping[str, float]] = ...) -> None: ...
