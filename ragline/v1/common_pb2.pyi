from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Chunk(_message.Message):
    __slots__ = ("chunk_id", "doc_id", "ordinal", "text", "pages", "source", "title_path", "kind")
    CHUNK_ID_FIELD_NUMBER: _ClassVar[int]
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    ORDINAL_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    PAGES_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TITLE_PATH_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    chunk_id: str
    doc_id: str
    ordinal: int
    text: str
    pages: _containers.RepeatedScalarFieldContainer[int]
    source: str
    title_path: _containers.RepeatedScalarFieldContainer[str]
    kind: str
    def __init__(self, chunk_id: _Optional[str] = ..., doc_id: _Optional[str] = ..., ordinal: _Optional[int] = ..., text: _Optional[str] = ..., pages: _Optional[_Iterable[int]] = ..., source: _Optional[str] = ..., title_path: _Optional[_Iterable[str]] = ..., kind: _Optional[str] = ...) -> None: ...

class Hit(_message.Message):
    __slots__ = ("chunk", "score", "stage_scores", "rank")
    class StageScoresEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    STAGE_SCORES_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    chunk: Chunk
    score: float
    stage_scores: _containers.ScalarMap[str, float]
    rank: int
    def __init__(self, chunk: _Optional[_Union[Chunk, _Mapping]] = ..., score: _Optional[float] = ..., stage_scores: _Optional[_Mapping[str, float]] = ..., rank: _Optional[int] = ...) -> None: ...

class Citation(_message.Message):
    __slots__ = ("number", "chunk_id", "doc_id", "pages", "source")
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_ID_FIELD_NUMBER: _ClassVar[int]
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    PAGES_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    number: int
    chunk_id: str
    doc_id: str
    pages: _containers.RepeatedScalarFieldContainer[int]
    source: str
    def __init__(self, number: _Optional[int] = ..., chunk_id: _Optional[str] = ..., doc_id: _Optional[str] = ..., pages: _Optional[_Iterable[int]] = ..., source: _Optional[str] = ...) -> None: ...

class SparseVector(_message.Message):
    __slots__ = ("indices", "values")
    INDICES_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    indices: _containers.RepeatedScalarFieldContainer[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, indices: _Optional[_Iterable[int]] = ..., values: _Optional[_Iterable[float]] = ...) -> None: ...
