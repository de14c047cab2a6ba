"""primecache.hf against a real primecached, with tiny random transformers
models (hf_worker.py): a cache published by one process and restored by
another continues bit for bit as the cache kept in memory does, and close to
a full prefill; a cache of another model or dtype is a miss; a daemon that
answers for another model, a damaged chunk, an unsupported layer type and
batch size 2 are refused, with nothing written or restored.

Skipped where torch or transformers is missing (CI's Debian), unless
PRIMECACHE_REQUIRE_GPU is set (the GPU machine), where that is a failure."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

REQUIRE_GPU = bool(os.environ.get("PRIMECACHE_REQUIRE_GPU"))
try:
    import torch
    import transformers  # noqa: F401
    from transformers import cache_utils
except ImportError as e:
    if REQUIRE_GPU:
        pytest.fail(f"PRIMECACHE_REQUIRE_GPU is set but {e.name} cannot be imported", pytrace=False)
    pytest.skip(f"{e.name} is not installed", allow_module_level=True)

import primecache  # noqa: E402
import primecache.hf as phf  # noqa: E402
import primecache.torch as pt  # noqa: E402
from hf_worker import device, make_model  # noqa: E402

WORKER = pathlib.Path(__file__).with_name("hf_worker.py")
MODELS = ["qwen3_next", "kimi_linear", "deepseek_v32", "gemma3_text", "falcon_h1"]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
PROMPT, NEXT = 12, 5
# Continuing from a kept (or restored) cache vs a full prefill of the whole
# sequence, max |logit difference| measured on an H200 (transformers 5.17):
# at most 3.4e-7 in float32, 0 in bfloat16. The bounds leave room for other
# devices and kernels; the restore itself is bit for bit (torch.equal).
FULL_PREFILL_TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def token_ids(seed=123, n=PROMPT + NEXT, batch=1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, 256, (batch, n), generator=gen).to(device())


def prime(model, ids):
    with torch.no_grad():
        return model(ids, use_cache=True).past_key_values


def run_worker(daemon, tmp_path, model_type, dtype_name, ids, seed=0):
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps(ids[0].tolist()))
    out = tmp_path / "worker.pt"
    proc = subprocess.run([sys.executable, str(WORKER), daemon.socket, model_type, dtype_name, str(seed), str(tokens),
                           str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"the worker failed:\n{proc.stderr[-3000:]}"
    return torch.load(out, weights_only=False)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("model_type", MODELS)
def test_a_cache_restored_in_another_process_continues_bit_for_bit(client, daemon, tmp_path, model_type, dtype_name):
    dtype = DTYPES[dtype_name]
    model = make_model(model_type, dtype)
    store = phf.CacheStore(client, model)
    ids = token_ids()
    cache = prime(model, ids[:, :PROMPT])
    res = store.publish(ids[:, :PROMPT], cache)
    assert not res.existed
    with torch.no_grad():
        kept = model(ids[:, PROMPT:], past_key_values=cache, use_cache=True).logits
        full = model(ids, use_cache=False).logits[:, PROMPT:]
        generated = model.generate(ids, past_key_values=prime(model, ids[:, :PROMPT]), max_new_tokens=4,
                                   do_sample=False)
        # In this process too, so that a failure says which side differs.
        restored, covered = store.lookup(ids)
        assert covered == PROMPT and type(restored) is cache_utils.DynamicCache
        assert restored.get_seq_length() == PROMPT
        here = model(ids[:, PROMPT:], past_key_values=restored, use_cache=True).logits
    assert torch.equal(here, kept)
    assert (kept.float() - full.float()).abs().max().item() <= FULL_PREFILL_TOLERANCE[dtype]

    other = run_worker(daemon, tmp_path, model_type, dtype_name, ids)
    digest = store.fingerprint.weights_digest
    assert other["weights_digest"] == (digest.hi, digest.lo), "the other process built other weights"
    assert other["covered"] == PROMPT
    assert torch.equal(other["logits"], kept.cpu()), "restored in another process, the continuation differs"
    assert torch.equal(other["generated"], generated.cpu())


def test_a_cache_of_another_model_or_dtype_is_a_miss(client):
    ids = token_ids()
    model = make_model("gemma3_text", torch.float32)
    store = phf.CacheStore(client, model)
    store.publish(ids[:, :PROMPT], prime(model, ids[:, :PROMPT]))
    assert store.lookup(ids)[1] == PROMPT
    others = {
        "other weights": make_model("gemma3_text", torch.float32, seed=1),
        "another dtype": make_model("gemma3_text", torch.bfloat16),
        "fewer layers": make_model("gemma3_text", torch.float32, num_hidden_layers=2),
        "another window": make_model("gemma3_text", torch.float32, sliding_window=6),
    }
    for what, other in others.items():
        other_store = phf.CacheStore(client, other)
        assert other_store.model_id.digest != store.model_id.digest, what
        assert other_store.lookup(ids) == (None, 0), what
    assert client.stats().store.entries == 1


def test_a_daemon_answering_for_another_model_is_refused_before_anything_is_written(client, monkeypatch):
    ids = token_ids()
    published = {}
    for model_type in ("qwen3_next", "gemma3_text"):
        model = make_model(model_type, torch.float32)
        store = phf.CacheStore(client, model)
        store.publish(ids[:, :PROMPT], prime(model, ids[:, :PROMPT]))
        published[model_type] = store
    fetches = []
    real_fetch_into = pt.fetch_into
    monkeypatch.setattr(pt, "fetch_into", lambda *a, **k: fetches.append(a) or real_fetch_into(*a, **k))
    cases = [
        ("qwen3_next", make_model("qwen3_next", torch.bfloat16),
         r"store layer 0 \(layer 0, LinearAttentionLayer\): stored .*conv_dtype f32 != cache bf16"),
        ("qwen3_next", make_model("qwen3_next", torch.float32, num_hidden_layers=2),
         r"entry \d+ has 4 store layers; the model has 2"),
        ("gemma3_text", make_model("gemma3_text", torch.float32, sliding_window=6),
         r"store layer 0 \(layer 0, DynamicSlidingWindowLayer\): stored .*rows 7 != cache 5"),
        ("gemma3_text", make_model("gemma3_text", torch.float32, head_dim=8),
         r"store layer 0 \(layer 0, DynamicSlidingWindowLayer\): stored k_width 32 != cache 16"),
    ]
    for published_type, model, says in cases:
        store = phf.CacheStore(client, model)
        store.model_id = published[published_type].model_id  # the daemon answers with the other model's entry
        with pytest.raises(ValueError, match=says):
            store.lookup(ids)
    assert not fetches, "a refused restore fetched"


def test_a_damaged_chunk_is_refused_and_nothing_is_restored(client, daemon):
    ids = token_ids()
    model = make_model("qwen3_next", torch.float32)
    store = phf.CacheStore(client, model)
    cache = prime(model, ids[:, :PROMPT])
    keys = cache.layers[1].keys[0].transpose(0, 1).contiguous().cpu()  # store layer 1's k_rows
    store.publish(ids[:, :PROMPT], cache, transform="raw/v1")
    needle = keys.reshape(-1).view(torch.uint8).numpy().tobytes()[:64]
    for segment in (p for p in pathlib.Path(daemon.root / "data").rglob("*") if p.is_file() and "seg" in p.name):
        data = segment.read_bytes()
        at = data.find(needle)
        if at >= 0:
            with open(segment, "r+b") as f:  # in place: the daemon may have the file mapped
                f.seek(at + 9)
                f.write(bytes([data[at + 9] ^ 0x40]))
            break
    else:
        pytest.fail("the raw chunk's bytes are in no segment file")
    restored = "not returned"
    with pytest.raises(primecache.Error):
        restored = store.lookup(ids)
    assert restored == "not returned"


def test_an_unsupported_layer_type_is_refused_by_its_class_name(client):
    ids = token_ids()
    model = make_model("gemma3_text", torch.float32)
    store = phf.CacheStore(client, model)

    class OwnLayer(cache_utils.DynamicLayer):
        """A subclass (as QuantizedLayer is) is not a DynamicLayer to us."""

    for replacement, name in ((cache_utils.StaticLayer(max_cache_len=32), "StaticLayer"), (OwnLayer(), "OwnLayer")):
        cache = prime(model, ids[:, :PROMPT])
        cache.layers[1] = replacement
        with pytest.raises(ValueError, match=rf"layer 1: {name} is not a cache layer type primecache.hf stores"):
            store.publish(ids[:, :PROMPT], cache)
    class OwnCache(cache_utils.DynamicCache):
        """Another cache class, however like a DynamicCache."""

    with pytest.raises(ValueError, match=r"a cache of class OwnCache; primecache.hf stores a DynamicCache"):
        store.publish(ids[:, :PROMPT], OwnCache())
    assert client.stats().store.entries == 0, "nothing reached the store"


def test_batch_size_2_and_a_length_that_differs_are_refused(client):
    model = make_model("qwen3_next", torch.float32)
    store = phf.CacheStore(client, model)
    two = token_ids(batch=2)
    cache = prime(model, two[:, :PROMPT])
    with pytest.raises(ValueError, match=r"tokens of batch size 2"):
        store.publish(two[:, :PROMPT], cache)
    with pytest.raises(ValueError, match=r"layer 0 \(LinearAttentionLayer\): batch size 2; primecache.hf stores "
                                         r"caches of batch size 1"):
        store.publish(two[0, :PROMPT], cache)
    with pytest.raises(ValueError, match=r"tokens of batch size 2"):
        store.lookup(two)
    ids = token_ids()
    with pytest.raises(ValueError, match=r"layer 1 \(DynamicLayer\): holds 12 tokens, not the 11 given"):
        store.publish(ids[:, :PROMPT - 1], prime(model, ids[:, :PROMPT]))
    assert client.stats().store.entries == 0, "nothing reached the store"


@pytest.mark.skipif(not REQUIRE_GPU, reason="only where PRIMECACHE_REQUIRE_GPU is set")
def test_the_gpu_machine_runs_these_on_cuda():
    assert torch.cuda.is_available() and device() == "cuda"
