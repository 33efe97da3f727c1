from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SearchMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SEARCH_MODE_UNSPECIFIED: _ClassVar[SearchMode]
    SEARCH_MODE_SPARSE: _ClassVar[SearchMode]
    SEARCH_MODE_DENSE: _ClassVar[SearchMode]
    SEARCH_MODE_HYBRID: _ClassVar[SearchMode]

class Fusion(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FUSION_UNSPECIFIED: _ClassVar[Fusion]
    FUSION_RRF: _ClassVar[Fusion]
    FUSION_WEIGHTED: _ClassVar[Fusion]
SEARCH_MODE_UNSPECIFIED: SearchMode
SEARCH_MODE_SPARSE: SearchMode
SEARCH_MODE_DENSE: SearchMode
SEARCH_MODE_HYBRID: SearchMode
FUSION_UNSPECIFIED: Fusion
FUSION_RRF: Fusion
FUSION_WEIGHTED: Fusion

class Chunk(_message.Message):
    __slots__ = ("chunk_id", "doc_id", "ordinal", "text", "pages", "source", "title_path", "kind", "collection", "quality", "path", "doc_title")
    CHUNK_ID_FIELD_NUMBER: _ClassVar[int]
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    ORDINAL_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    PAGES_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TITLE_PATH_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    QUALITY_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    DOC_TITLE_FIELD_NUMBER: _ClassVar[int]
    chunk_id: str
    doc_id: str
    ordinal: int
    text: str
    pages: _containers.RepeatedScalarFieldContainer[int]
    source: str
    title_path: _containers.RepeatedScalarFieldContainer[str]
    kind: str
    collection: str
    quality: float
    path: str
    doc_title: str
    def __init__(self, chunk_id: _Optional[str] = ..., doc_id: _Optional[str] = ..., ordinal: _Optional[int] = ..., text: _Optional[str] = ..., pages: _Optional[_Iterable[int]] = ..., source: _Optional[str] = ..., title_path: _Optional[_Iterable[str]] = ..., kind: _Optional[str] = ..., collection: _Optional[str] = ..., quality: _Optional[float] = ..., path: _Optional[str] = ..., doc_title: _Optional[str] = ...) -> None: ...

class Hit(_message.Message):
    __slots__ = ("chunk", "score", "stage_scores", "rank", "terms", "via")
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
    TERMS_FIELD_NUMBER: _ClassVar[int]
    VIA_FIELD_NUMBER: _ClassVar[int]
    chunk: Chunk
    score: float
    stage_scores: _containers.ScalarMap[str, float]
    rank: int
    terms: _containers.RepeatedCompositeFieldContainer[TermWeight]
    via: str
    def __init__(self, chunk: _Optional[_Union[Chunk, _Mapping]] = ..., score: _Optional[float] = ..., stage_scores: _Optional[_Mapping[str, float]] = ..., rank: _Optional[int] = ..., terms: _Optional[_Iterable[_Union[TermWeight, _Mapping]]] = ..., via: _Optional[str] = ...) -> None: ...

class TermWeight(_message.Message):
    __slots__ = ("term", "weight")
    TERM_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    term: str
    weight: float
    def __init__(self, term: _Optional[str] = ..., weight: _Optional[float] = ...) -> None: ...

class Filter(_message.Message):
    __slots__ = ("doc_ids", "kinds", "collections")
    DOC_IDS_FIELD_NUMBER: _ClassVar[int]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    COLLECTIONS_FIELD_NUMBER: _ClassVar[int]
    doc_ids: _containers.RepeatedScalarFieldContainer[str]
    kinds: _containers.RepeatedScalarFieldContainer[str]
    collections: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, doc_ids: _Optional[_Iterable[str]] = ..., kinds: _Optional[_Iterable[str]] = ..., collections: _Optional[_Iterable[str]] = ...) -> None: ...

class SearchOptions(_message.Message):
    __slots__ = ("mode", "fusion", "sparse_weight", "dense_weight", "filter", "explain", "graph")
    MODE_FIELD_NUMBER: _ClassVar[int]
    FUSION_FIELD_NUMBER: _ClassVar[int]
    SPARSE_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    DENSE_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    EXPLAIN_FIELD_NUMBER: _ClassVar[int]
    GRAPH_FIELD_NUMBER: _ClassVar[int]
    mode: SearchMode
    fusion: Fusion
    sparse_weight: float
    dense_weight: float
    filter: Filter
    explain: bool
    graph: bool
    def __init__(self, mode: _Optional[_Union[SearchMode, str]] = ..., fusion: _Optional[_Union[Fusion, str]] = ..., sparse_weight: _Optional[float] = ..., dense_weight: _Optional[float] = ..., filter: _Optional[_Union[Filter, _Mapping]] = ..., explain: _Optional[bool] = ..., graph: _Optional[bool] = ...) -> None: ...

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
