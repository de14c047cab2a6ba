"""Type stubs of primecache._primecache (python/primecache/*.cc)."""

from enum import Enum
from typing import Any, Literal, Mapping, Optional, Sequence, Tuple, Union, overload

import numpy as np
import numpy.typing as npt

Tokens = Union[Sequence[int], npt.NDArray[np.integer[Any]]]
Planes = Union[Mapping[str, npt.NDArray[Any]], Sequence[npt.NDArray[Any]]]

class ElementType(Enum):
    f32 = 0
    bf16 = 1
    f16 = 2
    f8e4m3 = 3

def element_bytes(type: ElementType) -> int: ...
def plane_dtype(type: ElementType) -> np.dtype[Any]: ...

class Error(Exception):
    code: str
    message: str

class NotFoundError(Error, KeyError): ...
class InvalidArgumentError(Error, ValueError): ...
class UnavailableError(Error, ConnectionError): ...
class DeadlineExceededError(Error, TimeoutError): ...

class LatentShape:
    len: int
    width: int
    index_width: int
    pool: int
    pools_ready: int
    index_is_ring: bool
    index_ring_rows: int
    dtype: ElementType
    index_dtype: ElementType
    def __init__(self, *, len: int = ..., width: int = ..., index_width: int = ..., pool: int = ...,
                 pools_ready: int = ..., index_is_ring: bool = ..., index_ring_rows: int = ...,
                 dtype: ElementType = ..., index_dtype: ElementType = ...) -> None: ...
    def tail_rows(self) -> int: ...

class RecurrentShape:
    heads: int
    head_dim: int
    kernel: int
    conv_dtype: ElementType
    state_dtype: ElementType
    def __init__(self, *, heads: int = ..., head_dim: int = ..., kernel: int = ...,
                 conv_dtype: ElementType = ..., state_dtype: ElementType = ...) -> None: ...

class KvFormat:
    window: int
    quant_bits: int
    head_dim: int
    signs_digest: int
    index_width: int
    def __init__(self, *, window: int = ..., quant_bits: int = ..., head_dim: int = ...,
                 signs_digest: int = ..., index_width: int = ...) -> None: ...

class KvShape:
    len: int
    k_width: int
    v_width: int
    format: KvFormat
    rows: int
    dtype: ElementType
    index_dtype: ElementType
    def __init__(self, *, len: int = ..., k_width: int = ..., v_width: int = ..., format: KvFormat = ...,
                 rows: int = ..., dtype: ElementType = ..., index_dtype: ElementType = ...) -> None: ...
    def held_rows(self) -> int: ...

class LinearStateShape:
    conv_channels: int
    conv_width: int
    state_heads: int
    state_k_dim: int
    state_v_dim: int
    conv_dtype: ElementType
    state_dtype: ElementType
    def __init__(self, *, conv_channels: int = ..., conv_width: int = ..., state_heads: int = ...,
                 state_k_dim: int = ..., state_v_dim: int = ..., conv_dtype: ElementType = ...,
                 state_dtype: ElementType = ...) -> None: ...

LayerShape = Union[LatentShape, RecurrentShape, KvShape, LinearStateShape]

class Hash128:
    lo: int
    hi: int
    def __init__(self, *, lo: int = ..., hi: int = ...) -> None: ...

class ModelFingerprint:
    architecture: str
    plan_digest: Hash128
    weights_digest: Hash128
    codec_versions: list[str]
    def __init__(self, *, architecture: str = ..., plan_digest: Hash128 = ..., weights_digest: Hash128 = ...,
                 codec_versions: list[str] = ...) -> None: ...
    def digest(self) -> Hash128: ...
    def encode(self) -> bytes: ...

class ModelCost:
    flops_per_token: int
    attention_layers: int
    attention_flops_per_pair: int
    def __init__(self, *, flops_per_token: int = ..., attention_layers: int = ...,
                 attention_flops_per_pair: int = ...) -> None: ...

class ModelId:
    digest: Hash128
    name: str
    descriptor: bytes
    cost: ModelCost
    def __init__(self, *, digest: Hash128 = ..., name: str = ..., descriptor: bytes = ..., cost: ModelCost = ...) -> None: ...
    @staticmethod
    def from_fingerprint(fingerprint: ModelFingerprint, name: str = "") -> ModelId: ...

def codec_identities() -> list[str]: ...
def cuda_runtime_available() -> bool: ...
def codec_versions(shapes: list[LayerShape]) -> list[str]: ...
def plan_digest(shapes: list[LayerShape]) -> Hash128: ...

class RankLayerSource:
    entry_layers: list[int]
    first_stored_rank: int
    sharded: bool

class RankPartsPlan:
    stored_ranks: int
    tp: int
    rank: int
    fetch: list[int]
    layers: list[RankLayerSource]

def is_sharded(shape: LayerShape) -> bool: ...
def head_groups(tp: int, rank_heads: list[int]) -> int: ...
def rank_parts(sharded: list[bool], entry_layers: int, stored_ranks: int, tp: int, rank: int) -> RankPartsPlan: ...
def assemble_rank_parts(plan: RankPartsPlan, fetched: list[Any], kv_heads: int) -> list[tuple[LayerShape, dict[str, Any]]]: ...

class ClientOptions:
    endpoint: str
    client_name: str
    ns: str
    timeout: float
    connect_timeout: float
    reconnect_attempts: int
    reconnect_backoff: float
    shared_memory: bool
    shared_memory_bytes: int
    tp_rank: int | None
    def __init__(self, *, endpoint: str = ..., client_name: str = ..., ns: str = ..., timeout: float = ...,
                 connect_timeout: float = ..., reconnect_attempts: int = ..., reconnect_backoff: float = ...,
                 shared_memory: bool = ..., shared_memory_bytes: int = ..., tp_rank: int | None = ...) -> None: ...

class ServerInfo:
    version: int
    server: str
    max_message_bytes: int
    max_chunk_bytes: int
    max_publishes_in_flight: int
    admin: bool
    device_copies: bool

class EntryState(Enum):
    LIVE = 0
    QUARANTINED = 1

class LookupHit:
    id: int
    length: int
    layers: int
    ranks: int
    chunk_bytes: int
    raw_bytes: int

class PublishResult:
    id: int
    existed: bool
    new_chunk_bytes: int
    shared_chunk_bytes: int
    evicted: int
    group_pending: bool

class EntryInfo:
    id: int
    state: EntryState
    model: Hash128
    model_name: str
    model_descriptor: bytes
    ns: str
    length: int
    tokens: list[int]
    layers: int
    ranks: int
    chunk_bytes: int
    raw_bytes: int
    meta_bytes: int
    flops: float
    created_unix_ms: int
    last_access: int
    hits: int
    reason: str
    quarantined: bool

class EntryDetail:
    info: EntryInfo
    layer_headers: list[bytes]

class ListPage:
    entries: list[EntryInfo]
    next_page_token: str

class EntryCheckReport:
    ok: bool
    message: str
    layers: int
    bytes: int

class StoreStats:
    entries: int
    quarantined: int
    chunks: int
    stored_bytes: int
    logical_bytes: int
    raw_bytes: int
    dedup_saved_bytes: int
    hits: int
    misses: int
    evictions: int
    admission_refusals: int
    active_leases: int
    byte_budget: int
    disk_bytes: int
    staged_bytes: int
    block_cache_used_bytes: int
    block_cache_capacity_bytes: int
    memtable_bytes: int
    table_reader_bytes: int
    write_error: str

class RemoteStats:
    hits: int
    misses: int
    errors: int
    misses_cached: int
    fetched_bytes: int
    queued: int
    put: int
    dropped: int
    put_bytes: int
    queue_depth: int
    evicted: int
    damaged: int
    refused: int
    breaker_open: bool
    breaker_opens: int
    fast_failures: int
    moved: int
    asked: int

class DaemonStats:
    store: StoreStats
    connections: int
    publishes_in_flight: int
    uncommitted_bytes: int
    fetch_window_waits: int
    rss_bytes: int
    heap_in_use_bytes: int
    heap_free_bytes: int
    remote: Optional[RemoteStats]

class ChunkRecord:
    raw_bytes: int
    encoded_bytes: int
    raw_checksum: int
    encoded_checksum: int

class PlaneRecord:
    name: str
    transform: str
    level: int
    rows: int
    row_width: int
    chunk_rows: int
    chunks: list[ChunkRecord]

class LayerHeader:
    kind: str
    shape: LayerShape
    planes: list[PlaneRecord]
    chunk_count: int

def parse_layer_header(header: bytes) -> LayerHeader: ...

class PlaneLayout:
    name: str
    rows: int
    row_width: int
    dtype: ElementType
    append_only: bool
    raw_bytes: int

def plane_layouts(shape: LayerShape) -> list[PlaneLayout]: ...

class FetchBuffer:
    fetched_bytes: int
    copied_bytes: int

class FetchedLayer:
    layer: int
    header_bytes: bytes
    header: Optional[LayerHeader]
    shape: Optional[LayerShape]
    planes: dict[str, npt.NDArray[np.float32]]
    chunks: list[npt.NDArray[np.uint8]]

LayerInput = Union[Tuple[LayerShape, Planes], FetchedLayer]

class Client:
    @staticmethod
    def connect(options: ClientOptions) -> Client: ...
    @overload
    def lookup(self, model: ModelId, tokens: Tokens) -> Optional[LookupHit]: ...
    @overload
    def lookup(self, model: ModelId, tokens: Tokens, *, shared: Literal[False]) -> Optional[LookupHit]: ...
    @overload
    def lookup(self, model: ModelId, tokens: Tokens, *, shared: Literal[True]) -> Tuple[Optional[LookupHit], int]: ...
    def publish(self, model: ModelId, tokens: Tokens, layers: Sequence[LayerInput], *,
                transform: Optional[str] = None, level: int = 0, chunk_bytes: int = 1048576,
                group: Optional[tuple[int, int, int]] = None) -> PublishResult: ...
    def fetch(self, entry: int, layers: Optional[Sequence[int]] = None, *, decode: bool = True) -> list[FetchedLayer]: ...
    def fetch_into(self, entry: int, planes: Mapping[int, Planes]) -> dict[int, LayerHeader]: ...
    def attach_device_window(self, device: int, bytes: int = ...) -> Optional[str]: ...
    def fetch_into_device(self, entry: int, planes: Mapping[int, Any], *, device: int, stream: int = 0,
                          window_bytes: int = ...) -> tuple[dict[int, LayerHeader], dict[str, int]]: ...
    def describe(self, entry: int, layer_headers: bool = False) -> EntryDetail: ...
    def stats(self) -> DaemonStats: ...
    def list(self, model: Optional[Hash128] = None, page_size: int = 100, page_token: str = "",
             omit_tokens: bool = False) -> ListPage: ...
    def check_entry(self, entry: int) -> EntryCheckReport: ...
    @property
    def server_info(self) -> ServerInfo: ...
    @property
    def connected(self) -> bool: ...
    def close(self) -> None: ...
    def __enter__(self) -> Client: ...
    def __exit__(self, *args: object) -> None: ...
