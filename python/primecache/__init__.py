"""primecache from Python: look prefixes up in the daemon, fetch their layers
as NumPy arrays, publish arrays as new entries (docs/python.md).

The classes are those of the C++ client (include/primecache/client.h and
entry.h); calls that talk to the daemon release the GIL, and a failed call
raises primecache.Error (or a subclass by status code) with the daemon's or
the client's message.
"""

from ._primecache import (  # noqa: F401  (the package's API)
    ChunkRecord,
    Client,
    ClientOptions,
    DaemonStats,
    DeadlineExceededError,
    EntryDetail,
    EntryInfo,
    ElementType,
    EntryState,
    Error,
    FetchBuffer,
    FetchedLayer,
    Hash128,
    InvalidArgumentError,
    KvFormat,
    KvShape,
    LatentShape,
    LayerHeader,
    ListPage,
    LinearStateShape,
    LookupHit,
    ModelCost,
    ModelFingerprint,
    ModelId,
    NotFoundError,
    PlaneLayout,
    PlaneRecord,
    PublishResult,
    RankLayerSource,
    RankPartsPlan,
    RecurrentShape,
    RemoteStats,
    ServerInfo,
    StoreStats,
    UnavailableError,
    EntryCheckReport,
    codec_identities,
    codec_versions,
    cuda_runtime_available,
    element_bytes,
    plane_dtype,
    plan_digest,
    plane_layouts,
    parse_layer_header,
    assemble_rank_parts,
    is_sharded,
    head_groups,
    rank_parts,
)


def connect(endpoint, **options) -> Client:
    """Connects to primecached at `endpoint` (a socket path, or
    "tcp:127.0.0.1:PORT"), with any ClientOptions field as a keyword
    (timeout=5.0, ns="tenant", shared_memory=True, ...); or with a
    ClientOptions as the only argument."""
    if isinstance(endpoint, ClientOptions):
        if options:
            raise TypeError("connect(ClientOptions) takes no other options")
        return Client.connect(endpoint)
    return Client.connect(ClientOptions(endpoint=endpoint, **options))
