"""The Python client against a real primecached (conftest.py starts it):
publish NumPy planes, look them up, fetch them back bit for bit, and the
errors, the zero-copy views and the released GIL."""

import ast
import gc
import pathlib
import signal
import socket
import threading
import time

import numpy as np
import pytest

import primecache

LENGTH = 40  # tokens of the test boundary


def model_id(name="py-test", shapes=None):
    """The model whose layers have these shapes (by default make_layers'):
    its plan digest is theirs, as the daemon checks at every publish."""
    if shapes is None:
        shapes = [shape for shape, _ in make_layers(np.random.default_rng(0))]
    fp = primecache.ModelFingerprint(architecture=name, plan_digest=primecache.plan_digest(shapes),
                                     weights_digest=primecache.Hash128(lo=3, hi=4),
                                     codec_versions=primecache.codec_versions(shapes))
    return primecache.ModelId.from_fingerprint(fp)


def random_planes(rng, shape_rows):
    """float32 planes of random bits' worth of values, with a NaN and a -0.0
    so that bit identity (not just equality) is what the tests compare."""
    out = {}
    for name, (rows, width) in shape_rows.items():
        a = rng.standard_normal((rows, width), dtype=np.float32)
        if a.size >= 2:
            a.flat[0] = np.float32("nan")
            a.flat[1] = np.float32(-0.0)
        out[name] = a
    return out


def make_layers(rng, length=LENGTH):
    """One layer of each kind: MLA latent with a DSA indexer, KDA recurrent, plain KV."""
    pool = 4
    latent = primecache.LatentShape(len=length, width=16, index_width=8, pool=pool, pools_ready=length // pool)
    recurrent = primecache.RecurrentShape(heads=2, head_dim=4, kernel=4)
    kv = primecache.KvShape(len=length, k_width=8, v_width=8)
    return [
        (latent, random_planes(rng, {"latent_rows": (length, 16), "index_tail_rows": (latent.tail_rows(), 8),
                                     "pool_keys": (length // pool, 4)})),
        (recurrent, random_planes(rng, {"conv_ring": (24, 3), "state": (8, 4)})),
        (kv, random_planes(rng, {"k_rows": (length, 8), "v_rows": (length, 8)})),
    ]


def tokens_of(rng, length=LENGTH):
    return rng.integers(1, 50000, size=length, dtype=np.uint32)


def assert_same_bits(want_layers, got_layers):
    assert len(got_layers) == len(want_layers)
    for i, ((shape, planes), got) in enumerate(zip(want_layers, got_layers)):
        assert got.layer == i
        assert got.shape == shape
        assert sorted(got.planes) == sorted(planes)
        for name, want in planes.items():
            have = got.planes[name]
            assert have.dtype == np.float32 and have.shape == want.shape, (i, name)
            assert np.array_equal(have.view(np.uint32), want.view(np.uint32)), (i, name)


def test_connect_says_hello(client):
    assert client.connected
    info = client.server_info
    assert info.version >= 1
    assert info.max_chunk_bytes > 0
    assert not info.admin  # the data socket


def test_publish_lookup_fetch_round_trip(client):
    rng = np.random.default_rng(1)
    layers, tokens, model = make_layers(rng), tokens_of(rng), model_id()
    assert client.lookup(model, tokens) is None

    pub = client.publish(model, tokens, layers)
    assert pub.id > 0 and not pub.existed and pub.new_chunk_bytes > 0

    longer = np.concatenate([tokens, tokens_of(rng, 7)])
    hit = client.lookup(model, longer.tolist())  # a list works as well as an array
    assert hit is not None
    assert (hit.id, hit.length, hit.layers) == (pub.id, LENGTH, 3)
    assert client.lookup(model, tokens[: LENGTH - 1]) is None  # shorter than every boundary
    assert client.lookup(model_id("another-model"), tokens) is None

    fetched = client.fetch(hit.id)
    assert_same_bits(layers, fetched)
    assert [f.header.kind for f in fetched] == ["mla-latent/v1", "kda-recurrent/v1", "kv-plain/v1"]
    assert all(p.transform == "raw/v1" for f in fetched for p in f.header.planes)  # the default

    again = client.publish(model, tokens, layers)
    assert again.existed and again.id == pub.id


def test_two_worker_ranks_publish_one_tensor_parallel_entry(daemon):
    """The workers of a TP-2 engine each publish their part (rank 0: the
    replicated latent layer and its half of the recurrent heads; rank 1: its
    half) on a connection of their own; the entry appears once both
    committed, and each rank fetches back only its own layers."""
    rng = np.random.default_rng(21)
    tokens = tokens_of(rng)
    latent, _ = make_layers(rng)[0]
    whole = primecache.RecurrentShape(heads=2, head_dim=4, kernel=4)
    half = primecache.RecurrentShape(heads=1, head_dim=4, kernel=4)
    parts = [[make_layers(rng)[0], (half, random_planes(rng, {"conv_ring": (12, 3), "state": (4, 4)}))],
             [(half, random_planes(rng, {"conv_ring": (12, 3), "state": (4, 4)}))]]
    parts[0][0] = (latent, parts[0][0][1])
    model = model_id("py-tp", shapes=[latent, whole])  # the whole model's plan, which the parts gather into
    with primecache.connect(daemon.socket, timeout=15) as rank0, primecache.connect(daemon.socket, timeout=15) as rank1:
        pending = rank1.publish(model, tokens, parts[1], group=(99, 2, 1))
        assert pending.group_pending and pending.id == 0
        assert rank0.lookup(model, tokens) is None  # not before every rank committed
        done = rank0.publish(model, tokens, parts[0], group=(99, 2, 0))
        assert not done.group_pending and done.id > 0
        hit = rank1.lookup(model, tokens)
        assert (hit.id, hit.ranks, hit.layers) == (done.id, 2, 3)
        assert rank0.describe(hit.id).info.ranks == 2
        assert_same_bits(parts[0], rank0.fetch(hit.id, [0, 1]))
        mine = rank1.fetch(hit.id, [2])
        assert mine[0].shape == half
        for name, want in parts[1][0][1].items():
            assert np.array_equal(mine[0].planes[name].view(np.uint32), want.view(np.uint32)), name
        with pytest.raises(ValueError):
            rank0.publish(model, tokens_of(rng), parts[0], group=(0, 2, 0))  # a group token is not 0


def worker_slice(shape, planes, tp, rank, kv_heads):
    """Worker `rank` of TP `tp`'s share of a whole layer, sliced in NumPy by
    the layouts docs/python.md gives (the oracle of assemble_rank_parts)."""
    if isinstance(shape, primecache.LatentShape):
        return shape, planes
    if isinstance(shape, primecache.RecurrentShape):
        h, d = shape.heads // tp, shape.head_dim
        rows = shape.heads * d  # one of the conv ring's q, k and v
        conv = np.concatenate([planes["conv_ring"][p * rows + rank * h * d: p * rows + (rank + 1) * h * d]
                               for p in range(3)])
        state = planes["state"][rank * h * d:(rank + 1) * h * d]
        return (primecache.RecurrentShape(heads=h, head_dim=d, kernel=shape.kernel),
                {"conv_ring": np.ascontiguousarray(conv), "state": np.ascontiguousarray(state)})
    kw, vw = shape.k_width // tp, shape.v_width // tp
    return (primecache.KvShape(len=shape.len, k_width=kw, v_width=vw),
            {"k_rows": np.ascontiguousarray(planes["k_rows"][:, rank * kw:(rank + 1) * kw]),
             "v_rows": np.ascontiguousarray(planes["v_rows"][:, rank * vw:(rank + 1) * vw])})


def test_workers_of_any_tp_size_assemble_their_shards_of_a_tp_entry(daemon):
    """Two workers publish a TP-2 entry (4 KDA heads, 4 kv heads); workers of
    TP 1, 2 and 4 then each fetch only the layers rank_parts names (on a
    connection that says its rank) and assemble_rank_parts makes their own
    shards, bit for bit the NumPy slice of the whole at their TP size."""
    rng = np.random.default_rng(33)
    tokens = tokens_of(rng)
    latent = make_layers(rng)[0]
    rec = primecache.RecurrentShape(heads=4, head_dim=2, kernel=3)
    kv = primecache.KvShape(len=LENGTH, k_width=4 * 3, v_width=4 * 2)
    whole = [latent,
             (rec, random_planes(rng, {"conv_ring": (24, 2), "state": (8, 2)})),
             (kv, random_planes(rng, {"k_rows": (LENGTH, 12), "v_rows": (LENGTH, 8)}))]
    sharded = [primecache.is_sharded(shape) for shape, _ in whole]
    assert sharded == [False, True, True]
    model = model_id("py-tp-reshard", shapes=[shape for shape, _ in whole])
    for rank in (1, 0):  # rank 0's part (every layer) commits last and writes the entry
        part = [worker_slice(shape, planes, 2, rank, 4) for (shape, planes), s in zip(whole, sharded)
                if rank == 0 or s]
        with primecache.connect(daemon.socket, timeout=15, tp_rank=rank) as worker:
            done = worker.publish(model, tokens, part, group=(1234, 2, rank))
    hit = primecache.connect(daemon.socket).lookup(model, tokens)
    assert (hit.id, hit.ranks, hit.layers) == (done.id, 2, 5)
    for tp in (1, 2, 4):
        for rank in range(tp):
            plan = primecache.rank_parts(sharded, hit.layers, hit.ranks, tp, rank)
            with primecache.connect(daemon.socket, timeout=15, tp_rank=rank) as worker:
                fetched = worker.fetch(hit.id, plan.fetch)
            mine = primecache.assemble_rank_parts(plan, fetched, 4)
            assert len(mine) == 3
            for m, ((shape, planes), (want_shape, want)) in enumerate(
                    zip(mine, [worker_slice(s, p, tp, rank, 4) for s, p in whole])):
                assert shape == want_shape, (tp, rank, m)
                for name, a in want.items():
                    assert np.array_equal(planes[name].view(np.uint32), a.view(np.uint32)), (tp, rank, m, name)
    # At TP 2 a worker reads its own part only; at TP 1 both parts of each sharded layer.
    assert primecache.rank_parts(sharded, 5, 2, 2, 1).fetch == [0, 3, 4]
    assert primecache.rank_parts(sharded, 5, 2, 1, 0).fetch == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError):
        primecache.rank_parts(sharded, 6, 2, 2, 0)  # not this model's entry
    with pytest.raises(ValueError):
        primecache.assemble_rank_parts(primecache.rank_parts(sharded, 5, 2, 2, 1), fetched[:1], 4)


def test_head_group_parts_let_every_tp_size_read_only_its_heads(daemon):
    """Two TP-2 workers publish head_groups' 4 parts (each its two runs of
    heads); workers of TP 4 then read one part of each sharded layer, TP 2
    two and TP 1 all four, and each assembles exactly its own heads."""
    rng = np.random.default_rng(35)
    tokens = tokens_of(rng)
    latent = make_layers(rng)[0]
    rec = primecache.RecurrentShape(heads=4, head_dim=2, kernel=3)
    kv = primecache.KvShape(len=LENGTH, k_width=4 * 3, v_width=4 * 2)
    whole = [latent,
             (rec, random_planes(rng, {"conv_ring": (24, 2), "state": (8, 2)})),
             (kv, random_planes(rng, {"k_rows": (LENGTH, 12), "v_rows": (LENGTH, 8)}))]
    sharded = [primecache.is_sharded(shape) for shape, _ in whole]
    groups = primecache.head_groups(2, [2, 2])  # 2 KDA heads and 2 kv heads a worker
    assert groups == 4
    assert primecache.head_groups(4, [1, 1]) == 4 and primecache.head_groups(2, [2, 1]) == 2
    model = model_id("py-tp-groups", shapes=[shape for shape, _ in whole])
    n = groups // 2
    for rank in (1, 0):
        with primecache.connect(daemon.socket, timeout=15, tp_rank=rank) as worker:
            for j in reversed(range(n)):  # part 0 (the replicated layers too) commits last
                p = rank * n + j
                part = [worker_slice(shape, planes, groups, p, 4) for (shape, planes), s in zip(whole, sharded)
                        if p == 0 or s]
                done = worker.publish(model, tokens, part, group=(4321, groups, p))
    hit = primecache.connect(daemon.socket).lookup(model, tokens)
    assert (hit.id, hit.ranks, hit.layers) == (done.id, 4, 3 + 2 * 3)
    for tp in (1, 2, 4):
        for rank in range(tp):
            plan = primecache.rank_parts(sharded, hit.layers, hit.ranks, tp, rank)
            assert len(plan.fetch) == 1 + 2 * (groups // tp), (tp, rank)  # its heads' parts, nothing more
            with primecache.connect(daemon.socket, timeout=15) as worker:
                mine = primecache.assemble_rank_parts(plan, worker.fetch(hit.id, plan.fetch), 4)
            for m, ((shape, planes), (want_shape, want)) in enumerate(
                    zip(mine, [worker_slice(s, p, tp, rank, 4) for s, p in whole])):
                assert shape == want_shape, (tp, rank, m)
                for name, a in want.items():
                    assert np.array_equal(planes[name].view(np.uint32), a.view(np.uint32)), (tp, rank, m, name)


def test_round_trip_through_shared_memory(daemon):
    rng = np.random.default_rng(12)
    layers, tokens, model = make_layers(rng), tokens_of(rng), model_id()
    with primecache.connect(daemon.socket, shared_memory=True, shared_memory_bytes=1 << 20, timeout=15) as c:
        entry = c.publish(model, tokens, layers, transform="raw/v1").id
        assert_same_bits(layers, c.fetch(entry))


def test_fetch_some_layers(client):
    rng = np.random.default_rng(2)
    layers, tokens, model = make_layers(rng), tokens_of(rng), model_id()
    entry = client.publish(model, tokens, layers).id
    got = client.fetch(entry, [2, 0])
    assert sorted(f.layer for f in got) == [0, 2]
    for f in got:
        shape, planes = layers[f.layer]
        assert f.shape == shape
        for name, want in planes.items():
            assert np.array_equal(f.planes[name].view(np.uint32), want.view(np.uint32))


def test_raw_planes_are_views_of_the_fetched_bytes(client):
    rng = np.random.default_rng(3)
    layers, tokens, model = make_layers(rng), tokens_of(rng), model_id()
    entry = client.publish(model, tokens, layers, transform="raw/v1").id
    fetched = client.fetch(entry)
    assert_same_bits(layers, fetched)
    raw_bytes = sum(a.nbytes for _, planes in layers for a in planes.values())
    kept = fetched[0].planes["latent_rows"]
    buffer = kept.base
    assert isinstance(buffer, primecache.FetchBuffer)
    assert buffer.copied_bytes == 0  # no plane was copied out of what came over the socket
    assert buffer.fetched_bytes == raw_bytes  # raw chunks: the fetched bytes are the planes
    for f in fetched:
        for name, a in f.planes.items():
            if a.size:
                assert not a.flags.owndata and a.base is buffer, (f.layer, name)
    want = layers[0][1]["latent_rows"].copy()
    del fetched, buffer
    gc.collect()
    assert np.array_equal(kept.view(np.uint32), want.view(np.uint32))  # the base kept the bytes alive


def test_fetched_arrays_are_read_only(client):
    rng = np.random.default_rng(13)
    layers, tokens, model = make_layers(rng), tokens_of(rng), model_id()
    entry = client.publish(model, tokens, layers, transform="raw/v1").id
    arrays = [a for f in client.fetch(entry) for a in f.planes.values()]
    arrays += [c for f in client.fetch(entry, decode=False) for c in f.chunks]
    assert arrays
    for a in arrays:
        assert not a.flags.writeable
        if a.size:
            with pytest.raises(ValueError):
                a.reshape(-1)[0] = 1


def test_encoded_planes_are_decoded_into_memory_of_their_own(client):
    rng = np.random.default_rng(4)
    layers, tokens, model = make_layers(rng), tokens_of(rng), model_id()
    # Raw, but cut into 256-byte chunks: a plane of several chunks is decoded.
    entry = client.publish(model, tokens, layers, transform="raw/v1", chunk_bytes=256).id
    fetched = client.fetch(entry)
    assert_same_bits(layers, fetched)
    latent = fetched[0]
    assert len(latent.header.planes[0].chunks) > 1
    assert latent.planes["latent_rows"].base.copied_bytes >= layers[0][1]["latent_rows"].nbytes


def test_fetch_without_decoding_gives_the_chunk_bytes(client):
    rng = np.random.default_rng(5)
    layers, tokens, model = make_layers(rng), tokens_of(rng), model_id()
    entry = client.publish(model, tokens, layers, transform="raw/v1").id
    fetched = client.fetch(entry, decode=False)
    assert [f.header for f in fetched] == [None, None, None]
    assert all(not f.planes for f in fetched)
    header = primecache.parse_layer_header(fetched[1].header_bytes)
    assert header.kind == "kda-recurrent/v1" and header.shape == layers[1][0]
    chunks = fetched[1].chunks
    assert [c.dtype for c in chunks] == [np.uint8, np.uint8]
    assert all(isinstance(c.base, primecache.FetchBuffer) for c in chunks)
    # Raw chunks in stored order: conv_ring, then state.
    assert bytes(chunks[1]) == layers[1][1]["state"].tobytes()


def test_fetched_layers_publish_again(client):
    rng = np.random.default_rng(6)
    layers, tokens, model = make_layers(rng), tokens_of(rng), model_id()
    fetched = client.fetch(client.publish(model, tokens, layers).id)
    other = tokens.copy()
    other[-1] += 1  # another boundary of the same length
    pub = client.publish(model, other, fetched)
    assert not pub.existed
    assert_same_bits(layers, client.fetch(pub.id))


def test_describe(client):
    rng = np.random.default_rng(7)
    layers, tokens, model = make_layers(rng), tokens_of(rng), model_id("described")
    entry = client.publish(model, tokens, layers).id
    detail = client.describe(entry, layer_headers=True)
    info = detail.info
    assert (info.id, info.length, info.layers, info.model_name) == (entry, LENGTH, 3, "described")
    assert info.tokens == tokens.tolist()
    assert info.model == model.digest
    assert info.model_descriptor == model.descriptor
    assert info.state == primecache.EntryState.LIVE and not info.quarantined
    assert info.raw_bytes == sum(a.nbytes for _, planes in layers for a in planes.values())
    headers = [primecache.parse_layer_header(h) for h in detail.layer_headers]
    assert [h.shape for h in headers] == [shape for shape, _ in layers]
    assert client.describe(entry).layer_headers == []


def test_stats_count_publishes_hits_and_misses(client):
    rng = np.random.default_rng(8)
    layers, tokens, model = make_layers(rng), tokens_of(rng), model_id()
    before = client.stats()
    entry = client.publish(model, tokens, layers).id
    assert client.lookup(model, tokens) is not None
    assert client.lookup(model, tokens_of(rng)) is None
    after = client.stats()
    assert after.store.entries == before.store.entries + 1
    assert after.store.hits == before.store.hits + 1
    assert after.store.misses == before.store.misses + 1
    assert after.store.stored_bytes > before.store.stored_bytes
    assert after.connections >= 1 and after.remote is None
    assert [e.id for e in client.list().entries] == [entry]
    assert client.check_entry(entry).ok


# ---- errors ----------------------------------------------------------------------


def test_connect_to_a_missing_socket_raises_with_the_message(tmp_path):
    path = str(tmp_path / "nobody.sock")
    with pytest.raises(primecache.Error) as e:
        primecache.connect(path, reconnect_attempts=0)
    assert isinstance(e.value, primecache.UnavailableError) and isinstance(e.value, ConnectionError)
    assert e.value.code == "unavailable"
    assert path in str(e.value) and str(e.value) == e.value.message


def test_fetch_and_describe_of_a_missing_entry(client):
    with pytest.raises(primecache.NotFoundError) as e:
        client.fetch(424242)
    assert isinstance(e.value, KeyError) and isinstance(e.value, primecache.Error)
    assert e.value.code == "not found" and e.value.message
    with pytest.raises(KeyError):
        client.describe(424242)


def test_arrays_that_do_not_fit_raise_value_error(client):
    rng = np.random.default_rng(9)
    tokens, model = tokens_of(rng), model_id()

    def publish_with(layer_index, plane, array):
        layers = make_layers(rng)
        layers[layer_index][1][plane] = array
        client.publish(model, tokens, layers)

    with pytest.raises(ValueError, match=r"layer 1 plane 'state': dtype float64, the plane is f32 \(want float32\)"):
        publish_with(1, "state", np.zeros((8, 4), dtype=np.float64))
    with pytest.raises(ValueError, match=r"layer 2 plane 'k_rows': shape \(40, 9\), want \(40, 8\)"):
        publish_with(2, "k_rows", np.zeros((LENGTH, 9), dtype=np.float32))
    with pytest.raises(ValueError, match="not C-contiguous"):
        publish_with(1, "state", np.zeros((4, 8), dtype=np.float32).T)
    with pytest.raises(ValueError, match="not a NumPy array"):
        publish_with(1, "state", [[0.0] * 4] * 8)
    layers = make_layers(rng)
    del layers[0][1]["pool_keys"]
    with pytest.raises(ValueError, match="layer 0: no plane 'pool_keys'"):
        client.publish(model, tokens, layers)
    with pytest.raises(ValueError, match="head_dim"):
        client.publish(model, tokens, [(primecache.RecurrentShape(heads=1, head_dim=0, kernel=4), {})])
    with pytest.raises(ValueError, match="tokens"):
        client.publish(model, [-1, 2], make_layers(rng))
    with pytest.raises(ValueError, match="tokens"):
        client.lookup(model, [1.5])
    assert client.stats().store.entries == 0  # nothing reached the store


def test_refusals_of_the_daemon_and_the_codecs_raise_error(client):
    rng = np.random.default_rng(10)
    model = model_id()
    with pytest.raises(primecache.InvalidArgumentError) as e:  # the layers hold 40 tokens, the boundary 39
        client.publish(model, tokens_of(rng, LENGTH - 1), make_layers(rng))
    assert e.value.code == "invalid argument" and "boundary of 39" in e.value.message
    with pytest.raises(primecache.Error) as e:
        client.publish(model, tokens_of(rng), make_layers(rng), transform="no-such-transform/v1")
    assert e.value.code == "not supported" and "unknown transform 'no-such-transform/v1'" in str(e.value)
    assert client.stats().store.entries == 0


def test_lookup_answers_the_shared_length_when_asked(client):
    rng = np.random.default_rng(13)
    length = 200
    layers, tokens, model = make_layers(rng, length), tokens_of(rng, length), model_id()
    client.publish(model, tokens, layers)
    query = np.concatenate([tokens[:150], tokens_of(rng, 60) + 60000])  # differs from token 150 on
    assert client.lookup(model, query) is None
    hit, shared = client.lookup(model, query, shared=True)
    assert hit is None and shared == 150
    hit, shared = client.lookup(model, np.concatenate([tokens, tokens[:5]]), shared=True)
    assert hit.length == length and shared == length


def test_a_publish_whose_layers_are_not_its_models_plan_is_refused(client):
    rng = np.random.default_rng(12)
    layers = make_layers(rng)
    others = [shape for shape, _ in make_layers(rng, LENGTH)][:2]  # the plan of a two-layer model
    with pytest.raises(primecache.InvalidArgumentError) as e:
        client.publish(model_id("two-layers", shapes=others), tokens_of(rng), layers)
    assert "not the plan of model 'two-layers'" in e.value.message
    assert client.stats().store.entries == 0
    assert not client.publish(model_id("three-layers"), tokens_of(rng), layers).existed


def test_a_closed_client_raises(daemon):
    c = primecache.connect(daemon.socket)
    c.close()
    with pytest.raises(primecache.Error, match="closed"):
        c.stats()


# ---- the GIL ---------------------------------------------------------------------


class Counter:
    """Counts in a Python thread until stopped, noting the longest pause
    between two counts: a thread holding the GIL stops it for that long."""

    def __init__(self):
        self.value = 0
        self.longest_pause = 0.0
        self.running = True
        self.thread = threading.Thread(target=self.run)

    def run(self):
        last = time.monotonic()
        while self.running:
            now = time.monotonic()
            self.longest_pause = max(self.longest_pause, now - last)
            last = now
            self.value += 1

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.running = False
        self.thread.join()


def test_a_blocking_call_releases_the_gil(tmp_path):
    # A socket that accepts connections and never answers: connect waits
    # the whole timeout (2 s) for the daemon's hello inside the C++ client.
    path = str(tmp_path / "silent.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as silent, Counter() as counter:
        silent.bind(path)
        silent.listen(4)
        time.sleep(0.05)  # the counter runs
        counter.longest_pause = 0.0
        t0 = time.monotonic()
        with pytest.raises(primecache.DeadlineExceededError):
            primecache.connect(path, timeout=2.0, reconnect_attempts=0)
        elapsed = time.monotonic() - t0
        pause = counter.longest_pause
    assert elapsed >= 1.9
    # Held through the call, the GIL would have stopped the counter for all of it.
    assert pause < 1.0, pause


CALLS = {
    "lookup": lambda c, entry, layers: c.lookup(model_id(), tokens_of(np.random.default_rng(0))),
    "fetch": lambda c, entry, layers: c.fetch(entry),
    "describe": lambda c, entry, layers: c.describe(entry),
    "stats": lambda c, entry, layers: c.stats(),
    "publish": lambda c, entry, layers: c.publish(model_id(), tokens_of(np.random.default_rng(1)), layers),
}


@pytest.mark.parametrize("call", sorted(CALLS))
def test_calls_release_the_gil_while_the_daemon_is_silent(daemon, call):
    rng = np.random.default_rng(13)
    layers = make_layers(rng)
    with primecache.connect(daemon.socket, timeout=1.0) as c, Counter() as counter:
        entry = c.publish(model_id(), tokens_of(rng), layers).id
        daemon.proc.send_signal(signal.SIGSTOP)  # the daemon stops answering
        try:
            counter.longest_pause = 0.0
            with pytest.raises(primecache.DeadlineExceededError):
                CALLS[call](c, entry, layers)
            pause = counter.longest_pause
        finally:
            daemon.proc.send_signal(signal.SIGCONT)
    assert pause < 0.5, pause


def test_concurrent_fetches_from_two_threads(client):
    rng = np.random.default_rng(11)
    length = 4096
    latent = primecache.LatentShape(len=length, width=512)  # 8 MiB of latent rows
    planes = {"latent_rows": rng.standard_normal((length, 512), dtype=np.float32),
              "index_tail_rows": np.zeros((0, 0), dtype=np.float32),
              "pool_keys": np.zeros((0, 0), dtype=np.float32)}
    tokens, model = tokens_of(rng, length), model_id(shapes=[latent])
    entry = client.publish(model, tokens, [(latent, planes)]).id
    results, errors = [[], []], []

    def fetch_loop(out):
        try:
            for _ in range(4):
                out.append(client.fetch(entry)[0].planes["latent_rows"])
        except Exception as e:  # noqa: BLE001  (reported by the main thread)
            errors.append(e)

    threads = [threading.Thread(target=fetch_loop, args=(r,)) for r in results]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert [len(r) for r in results] == [4, 4]
    for got in results[0] + results[1]:
        assert np.array_equal(got, planes["latent_rows"])


# ---- the package -----------------------------------------------------------------


def test_stubs_name_the_module_and_ship_beside_it():
    import primecache._primecache as native

    folder = pathlib.Path(native.__file__).parent
    assert (folder / "py.typed").exists()
    tree = ast.parse((folder / "_primecache.pyi").read_text())
    stubbed = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    public = {n for n in dir(native) if not n.startswith("_")}
    assert public == stubbed
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    for name, node in classes.items():
        members = {m.name for m in node.body if isinstance(m, ast.FunctionDef)}
        members |= {m.target.id for m in node.body if isinstance(m, ast.AnnAssign)}
        members |= {t.id for m in node.body if isinstance(m, ast.Assign) for t in m.targets}
        members = {m for m in members if not m.startswith("_")}
        cls = getattr(native, name)
        if issubclass(cls, BaseException):
            continue  # code and message are set per instance
        have = {m for m in dir(cls) if not m.startswith("_")}
        assert have - {"name", "value"} == members - {"name", "value"}, name  # enums have name and value
    assert set(primecache.__dict__) >= public

