"""primecache.torch against a real primecached (Debian's CPU torch in CI):
planes of every element type round trip bit for bit, into tensors the
caller owns, from strided and non-contiguous views, and every refusal names
what differs and leaves the store and the destinations as they were."""

import pytest

torch = pytest.importorskip("torch")

import primecache  # noqa: E402
import primecache.torch as pt  # noqa: E402
from primecache import ElementType as T  # noqa: E402

TYPES = [T.f32, T.bf16, T.f16] + ([T.f8e4m3] if hasattr(torch, "float8_e4m3fn") else [])
TRANSFORMS = ["raw/v1", "shuffle-zstd/v1"]
LEN = 150


def model_for(shapes, name="torch-test"):
    fp = primecache.ModelFingerprint(
        architecture=name, plan_digest=primecache.plan_digest(shapes),
        weights_digest=primecache.Hash128(hi=7, lo=len(shapes)), codec_versions=primecache.codec_versions(shapes))
    return primecache.ModelId.from_fingerprint(fp)


def shapes_of(t, u):
    """One layer of each kind, planes of type t (and u for a second group)."""
    return [
        primecache.LatentShape(len=LEN, width=24, index_width=8, pool=4, pools_ready=LEN // 4, dtype=t,
                               index_dtype=u),
        primecache.RecurrentShape(heads=2, head_dim=8, kernel=4, conv_dtype=t, state_dtype=u),
        primecache.KvShape(len=LEN, k_width=12, v_width=20, dtype=t),
        primecache.KvShape(len=LEN, k_width=12, v_width=20, format=primecache.KvFormat(window=64), rows=64,
                           dtype=u),
        primecache.KvShape(len=LEN, k_width=12, v_width=20, format=primecache.KvFormat(index_width=16), dtype=t,
                           index_dtype=u),
        primecache.LinearStateShape(conv_channels=40, conv_width=4, state_heads=2, state_k_dim=8, state_v_dim=6,
                                    conv_dtype=t, state_dtype=u),
    ]


def test_a_fingerprint_names_the_kinds_its_layers_use():
    assert primecache.codec_versions(shapes_of(T.f32, T.f32)) == [
        "kda-recurrent/v1", "kv-indexed/v1", "kv-plain/v1", "kv-rotating/v1", "linear-state/v1", "mla-latent/v1"]
    assert primecache.codec_versions([primecache.KvShape(len=3, k_width=4, v_width=4)] * 2) == ["kv-plain/v1"]
    layouts = pt.plane_layouts(shapes_of(T.bf16, T.f32)[4])
    assert layouts == [("k_rows", LEN, 12, T.bf16), ("v_rows", LEN, 20, T.bf16), ("index_keys", LEN, 16, T.f32)]
    assert pt.plane_layouts(shapes_of(T.bf16, T.f32)[5]) == [("conv_ring", 40, 4, T.bf16), ("state", 16, 6, T.f32)]


def random_plane(rows, width, dtype, gen):
    """Random bit patterns of the type (NaNs and subnormals among them)."""
    carrier = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}.get(
        dtype, torch.uint8)
    info = torch.iinfo(carrier)
    bits = torch.randint(info.min, info.max, (rows, width), generator=gen, dtype=torch.int64).to(carrier)
    return bits.view(dtype)


def planes_for(shape, gen):
    return {name: random_plane(rows, width, pt.torch_dtype(dtype), gen)
            for name, rows, width, dtype in pt.plane_layouts(shape)}


def bits(t):
    """A tensor's bits, to compare NaN payloads too."""
    carrier = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()]
    return t.contiguous().view(carrier)


def same_bits(a, b):
    return torch.equal(bits(a), bits(b))


@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_every_type_round_trips_bit_for_bit_through_the_daemon(client, t, transform):
    u = T.f32 if t != T.f32 else T.bf16  # a second group of another type
    shapes = shapes_of(t, u)
    gen = torch.Generator().manual_seed(5)
    layers = [(s, planes_for(s, gen)) for s in shapes]
    model = model_for(shapes)
    tokens = list(range(1, LEN + 1))
    res = pt.publish(client, model, tokens, layers, transform=transform, level=1 if "zstd" in transform else 0)
    hit = client.lookup(model, tokens)
    assert hit is not None and hit.id == res.id and hit.length == LEN
    got = pt.fetch(client, hit.id)
    for (shape, want), (got_shape, planes) in zip(layers, got):
        assert got_shape == shape
        for name, tensor in want.items():
            assert planes[name].dtype == tensor.dtype
            assert same_bits(planes[name], tensor), name


def test_fetch_into_writes_the_callers_tensors_in_place(client):
    shapes = shapes_of(T.bf16, T.f32)
    gen = torch.Generator().manual_seed(9)
    layers = [(s, planes_for(s, gen)) for s in shapes]
    model = model_for(shapes)
    res = pt.publish(client, model, list(range(LEN)), layers, transform="raw/v1")
    # The engine's preallocated cache: contiguous CPU tensors decoded into
    # in place (their storage is what the restore writes).
    dests = {i: (s, {n: torch.zeros_like(p) for n, p in planes.items()}) for i, (s, planes) in enumerate(layers)}
    ptrs = {i: {n: p.data_ptr() for n, p in d[1].items()} for i, d in dests.items()}
    headers = pt.fetch_into(client, res.id, dests)
    assert sorted(headers) == list(range(len(shapes)))
    for i, (shape, want) in enumerate(layers):
        assert headers[i].shape == shape
        for name, tensor in want.items():
            assert dests[i][1][name].data_ptr() == ptrs[i][name]
            assert same_bits(dests[i][1][name], tensor), (i, name)


def test_strided_and_non_contiguous_tensors_publish_and_restore_in_logical_order(client):
    kv = primecache.KvShape(len=LEN, k_width=4 * 8, v_width=4 * 8, dtype=T.f16)
    gen = torch.Generator().manual_seed(3)
    # A transformers-style cache, [heads, seq, head_dim]; its token-major
    # planes are the views [seq, heads, head_dim] (not contiguous).
    keys = random_plane(4 * LEN, 8, torch.float16, gen).view(4, LEN, 8)
    values = random_plane(4 * LEN, 8, torch.float16, gen).view(4, LEN, 8)
    k_view, v_view = keys.transpose(0, 1), values.transpose(0, 1)
    assert not k_view.is_contiguous()
    model = model_for([kv])
    res = pt.publish(client, model, list(range(LEN)), [(kv, [k_view, v_view])])
    # Stored token-major: the fetched plane is row t = token t's heads.
    (shape, planes), = pt.fetch(client, res.id)
    assert same_bits(planes["k_rows"], k_view.reshape(LEN, 32))
    # Restored into another cache's strided views, and a column slice.
    k2, v2 = torch.zeros(4, LEN, 8, dtype=torch.float16), torch.zeros(4, LEN, 8, dtype=torch.float16)
    pt.fetch_into(client, res.id, {0: (kv, {"k_rows": k2.transpose(0, 1), "v_rows": v2.transpose(0, 1)})})
    assert same_bits(k2, keys) and same_bits(v2, values)
    wide = torch.zeros(LEN, 64, dtype=torch.float16)
    half = torch.zeros(LEN, 32, dtype=torch.float16)
    pt.fetch_into(client, res.id, {0: (kv, [wide[:, :32], half])})
    assert same_bits(wide[:, :32], k_view.reshape(LEN, 32))
    assert not wide[:, 32:].any(), "nothing is written outside the view"


def test_a_publish_that_does_not_fit_is_refused_before_anything_is_sent(client):
    kv = primecache.KvShape(len=8, k_width=4, v_width=4, dtype=T.bf16)
    model = model_for([kv])
    good = torch.zeros(8, 4, dtype=torch.bfloat16)
    cases = [
        ([good.float(), good], r"layer 0 plane 'k_rows': dtype torch.float32, the plane is bf16"),
        ([good, good[:7]], r"layer 0 plane 'v_rows': 28 elements \(shape \(7, 4\)\); the plane has 8 rows of 4"),
        ([good, good.reshape(4, 8)], r"layer 0 plane 'v_rows': shape \(4, 8\); want \(8, 4\)"),
        ([good], r"layer 0: 1 planes; its kind has 2"),
        ({"k_rows": good}, r"layer 0: no plane 'v_rows'"),
        ({"k_rows": good, "v_rows": good, "state": good}, r"layer 0: planes \['state'\] are not its kind's"),
        ([good, "no"], r"layer 0 plane 'v_rows': a str, not a torch.Tensor"),
    ]
    for planes, says in cases:
        with pytest.raises(ValueError, match=says):
            pt.publish(client, model, list(range(8)), [(kv, planes)])
    with pytest.raises(ValueError, match=r"torch.int32 is not a plane type"):
        pt.element_type(torch.int32)
    assert client.stats().store.entries == 0, "nothing reached the store"


def test_a_restore_that_does_not_fit_is_refused_and_writes_nothing(client):
    kv = primecache.KvShape(len=8, k_width=4, v_width=4, dtype=T.bf16)
    gen = torch.Generator().manual_seed(1)
    planes = [random_plane(8, 4, torch.bfloat16, gen), random_plane(8, 4, torch.bfloat16, gen)]
    res = pt.publish(client, model_for([kv]), list(range(8)), [(kv, planes)])

    def dest(dtype=torch.bfloat16, rows=8):
        return [torch.zeros(rows, 4, dtype=dtype), torch.zeros(rows, 4, dtype=dtype)]

    f16 = primecache.KvShape(len=8, k_width=4, v_width=4, dtype=T.f16)
    longer = primecache.KvShape(len=9, k_width=4, v_width=4, dtype=T.bf16)
    cases = [
        ({0: (f16, dest(torch.float16))}, r"layer 0: stored dtype bf16 != cache f16"),
        ({0: (longer, dest(rows=9))}, r"layer 0: stored len 8 != cache 9"),
        ({0: (kv, dest(torch.float16))}, r"layer 0 plane 'k_rows': dtype torch.float16, the plane is bf16"),
        ({0: (kv, dest(rows=7))}, r"layer 0 plane 'k_rows': 28 elements"),
        ({1: (kv, dest())}, r"layer 1: the entry has 1 layers"),
        ({0: (primecache.RecurrentShape(heads=1, head_dim=4, kernel=2), dest())},
         r"layer 0: stored as a KvShape; the cache expects a RecurrentShape"),
    ]
    for layers, says in cases:
        with pytest.raises(ValueError, match=says):
            pt.fetch_into(client, res.id, layers)
        for _, ts in layers.values():
            assert all(not t.any() for t in ts), "a refused restore wrote a destination"


def test_the_binding_refuses_a_destination_array_of_another_type(client):
    import numpy as np
    kv = primecache.KvShape(len=8, k_width=4, v_width=4, dtype=T.f16)
    res = client.publish(model_for([kv]), list(range(8)), [(kv, [np.ones((8, 4), np.float16)] * 2)])
    with pytest.raises(ValueError, match=r"plane 'k_rows': dtype float32, the plane is f16 \(want float16\)"):
        client.fetch_into(res.id, {0: [np.zeros((8, 4), np.float32), np.zeros((8, 4), np.float16)]})
    ro = np.zeros((8, 4), np.float16)
    ro.setflags(write=False)
    with pytest.raises(ValueError, match=r"plane 'k_rows': not writable"):
        client.fetch_into(res.id, {0: [ro, np.zeros((8, 4), np.float16)]})
    out = [np.zeros((8, 4), np.float16), np.zeros((8, 4), np.float16)]
    headers = client.fetch_into(res.id, {0: out})
    assert headers[0].shape == kv and (out[0] == 1).all() and (out[1] == 1).all()
    # fetch returns typed arrays: f16 as float16, bf16 as its uint16 bits.
    (layer,) = client.fetch(res.id)
    assert layer.planes["k_rows"].dtype == np.float16
    assert primecache.plane_dtype(T.bf16) == np.uint16 and primecache.element_bytes(T.f8e4m3) == 1


def test_a_damaged_chunk_is_refused_before_its_rows_are_written(client, daemon):
    import pathlib
    kv = primecache.KvShape(len=64, k_width=16, v_width=16, dtype=T.bf16)
    gen = torch.Generator().manual_seed(2)
    planes = [random_plane(64, 16, torch.bfloat16, gen), random_plane(64, 16, torch.bfloat16, gen)]
    res = pt.publish(client, model_for([kv]), list(range(64)), [(kv, planes)], transform="raw/v1")
    # Flip one byte of the stored chunk bytes on disk, under the daemon.
    segments = sorted(p for p in pathlib.Path(daemon.root / "data").rglob("*") if p.is_file() and p.stat().st_size
                      >= planes[0].numel() * 2 and "seg" in p.name)
    assert segments, "no segment file found"
    target = segments[0]
    data = bytearray(target.read_bytes())
    needle = bits(planes[1]).numpy().tobytes()[:32]
    at = bytes(data).find(needle)
    assert at >= 0, "the raw chunk's bytes are in the segment"
    with open(target, "r+b") as f:  # in place: the daemon may have the file mapped
        f.seek(at + 5)
        f.write(bytes([data[at + 5] ^ 0x40]))
    dest = [torch.zeros(64, 16, dtype=torch.bfloat16), torch.zeros(64, 16, dtype=torch.bfloat16)]
    with pytest.raises(primecache.Error):
        pt.fetch_into(client, res.id, {0: (kv, dest)})
    assert not dest[1].any(), "the damaged chunk's rows were written"


# ---- CUDA tensors (the GPU machine: tools/gpu-check's run-python) ----------------

import os  # noqa: E402

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available() and not os.environ.get("PRIMECACHE_REQUIRE_GPU"),
                                reason="no CUDA device (PRIMECACHE_REQUIRE_GPU makes this a failure)")


@needs_cuda
@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_cuda_tensors_publish_and_restore_bit_for_bit(client, t):
    kv = primecache.KvShape(len=LEN, k_width=4 * 16, v_width=4 * 16, dtype=t)
    gen = torch.Generator().manual_seed(11)
    dtype = pt.torch_dtype(t)
    keys = random_plane(4 * LEN, 16, dtype, gen).view(4, LEN, 16).cuda()
    values = random_plane(4 * LEN, 16, dtype, gen).view(4, LEN, 16).cuda()
    res = pt.publish(client, model_for([kv]), list(range(LEN)), [(kv, [keys.transpose(0, 1), values.transpose(0, 1)])],
                     transform="raw/v1")
    k2, v2 = torch.zeros_like(keys), torch.zeros_like(values)
    pt.fetch_into(client, res.id, {0: (kv, {"k_rows": k2.transpose(0, 1), "v_rows": v2.transpose(0, 1)})})
    assert k2.is_cuda and same_bits(k2, keys) and same_bits(v2, values)
    (shape, planes), = pt.fetch(client, res.id, device="cuda")
    assert planes["k_rows"].is_cuda and same_bits(planes["k_rows"], keys.transpose(0, 1).reshape(LEN, 64))


@needs_cuda
@pytest.mark.parametrize("transform", TRANSFORMS)
def test_cuda_restores_take_raw_chunks_through_the_device_window(client, transform):
    shapes = shapes_of(T.bf16, T.f32)
    gen = torch.Generator().manual_seed(13)
    layers = [(s, planes_for(s, gen)) for s in shapes]
    res = pt.publish(client, model_for(shapes), list(range(LEN)), layers, transform=transform,
                     level=1 if "zstd" in transform else 0)
    # Contiguous destinations and, for layer 2, a transposed view of a
    # [heads, seq, head_dim] cache (filled through a device buffer).
    dests = {i: (s, {n: torch.zeros_like(p, device="cuda") for n, p in planes.items()})
             for i, (s, planes) in enumerate(layers)}
    heads_k = torch.zeros(4, LEN, 3, dtype=torch.bfloat16, device="cuda")
    dests[2][1]["k_rows"] = heads_k.transpose(0, 1)
    stats = {}
    pt.fetch_into(client, res.id, dests, stats=stats)
    assert stats["path"] == "device window", stats
    if transform == "raw/v1":
        assert stats["device_chunks"] > 0 and stats["host_chunks"] == 0, stats
    else:
        assert stats["device_chunks"] == 0 and stats["host_chunks"] > 0, stats
    for i, (shape, want) in enumerate(layers):
        for name, tensor in want.items():
            got = dests[i][1][name]
            assert got.is_cuda and same_bits(got.reshape(tensor.shape).cpu(), tensor), (i, name, stats)
    assert same_bits(heads_k.transpose(0, 1).reshape(LEN, 12).cpu(), layers[2][1]["k_rows"])


@needs_cuda
def test_a_damaged_chunk_is_refused_on_the_device_path(client, daemon):
    import pathlib
    kv = primecache.KvShape(len=64, k_width=16, v_width=16, dtype=T.bf16)
    gen = torch.Generator().manual_seed(4)
    planes = [random_plane(64, 16, torch.bfloat16, gen), random_plane(64, 16, torch.bfloat16, gen)]
    res = pt.publish(client, model_for([kv]), list(range(64)), [(kv, planes)], transform="raw/v1")
    needle = bits(planes[1]).numpy().tobytes()[:32]
    for segment in (p for p in pathlib.Path(daemon.root / "data").rglob("*") if p.is_file() and "seg" in p.name):
        data = segment.read_bytes()
        at = data.find(needle)
        if at >= 0:
            with open(segment, "r+b") as f:
                f.seek(at + 5)
                f.write(bytes([data[at + 5] ^ 0x40]))
            break
    else:
        pytest.fail("the raw chunk's bytes are in no segment file")
    dest = [torch.zeros(64, 16, dtype=torch.bfloat16, device="cuda") for _ in range(2)]
    stats = {}
    with pytest.raises(primecache.Error):
        pt.fetch_into(client, res.id, {0: (kv, dest)}, stats=stats)


def test_without_a_gpu_a_device_window_is_refused_with_the_reason(client):
    if torch.cuda.is_available():
        pytest.skip("this machine attaches one (the CUDA tests above)")
    why = client.attach_device_window(0)
    assert isinstance(why, str) and ("CUDA runtime" in why or "device copies" in why or "cuda" in why), why
