"""Hugging Face transformers caches in and out of primecached (docs/python.md,
"Transformers caches: primecache.hf").

A CacheStore binds one model. Its fingerprint (the config, the dtype and a
digest of the weights, the plan, the kinds) names the store's entries, so a
cache of one model is never found for another; its plan, learnt from a
one-token forward at construction, is each cache layer's class and geometry
(heads, head widths, dtypes, window), independent of length. Every publish
must match the plan, and everything a restore reads from the daemon (the
entry's length and tokens, each stored layer's kind, widths, dtypes, window,
rows) is checked against it before a byte is written.

Cache layers and the store layers they become, one per part, in layer order:

    DynamicLayer                          kv-plain/v1
    DynamicSlidingWindowLayer             kv-rotating/v1 (window W; rows min(len, W - 1), oldest first)
    DynamicIndexedLayer                   kv-indexed/v1 (plus the DSA indexer keys)
    LinearAttentionLayer                  linear-state/v1 (conv ring and recurrent state)
    LinearAttentionAndFullAttentionLayer  linear-state/v1, then kv-plain/v1 (two store layers)

Any other layer type (QuantizedLayer, the static layers, a model's own
subclass) is refused by its class name, never skipped; so is a cache of
batch size other than 1, a layer with several conv/recurrent states, and a
cache class other than DynamicCache. Planes are token-major views of the
cache's own tensors (row t = token t, all heads concatenated), stored as
their bytes: a restore is bit for bit what was published.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Optional, Union

import torch
from transformers import cache_utils as _cu

from . import _primecache as native
from . import torch as pt

# The cache layer classes this module stores, by name; a name missing from
# this transformers is simply never matched (an instance of it cannot exist).
_STORED_CLASSES = ("DynamicLayer", "DynamicSlidingWindowLayer", "DynamicIndexedLayer", "LinearAttentionLayer",
                   "LinearAttentionAndFullAttentionLayer")


def _stored_class(layer) -> str:
    """The layer's class name if it is exactly one of the stored classes
    (not a subclass: QuantizedLayer is a DynamicLayer); else ValueError."""
    name = type(layer).__name__
    if name in _STORED_CLASSES and type(layer) is getattr(_cu, name, None):
        return name
    raise ValueError(f"{type(layer).__name__} is not a cache layer type primecache.hf stores "
                     f"(it stores {', '.join(_STORED_CLASSES)})")


@dataclass(frozen=True)
class KvPart:
    """An attention part: keys [1, k_heads, rows, k_dim] and values [1,
    v_heads, rows, v_dim] of one dtype; window > 0 for a sliding layer;
    index_dim > 0 for DSA indexer keys [1, len, index_dim]."""

    k_heads: int
    k_dim: int
    v_heads: int
    v_dim: int
    dtype: torch.dtype
    window: int = 0
    index_dim: int = 0
    index_dtype: Optional[torch.dtype] = None

    def rows(self, length: int) -> int:
        """The rows a cache of `length` tokens holds: all of them, or the
        last window - 1 (what DynamicSlidingWindowLayer keeps)."""
        return min(length, self.window - 1) if self.window else length

    def shape(self, length: int) -> native.KvShape:
        kw = dict(len=length, k_width=self.k_heads * self.k_dim, v_width=self.v_heads * self.v_dim,
                  dtype=pt.element_type(self.dtype))
        if self.window:
            kw.update(format=native.KvFormat(window=self.window), rows=self.rows(length))
        elif self.index_dim:
            kw.update(format=native.KvFormat(index_width=self.index_dim), index_dtype=pt.element_type(self.index_dtype))
        return native.KvShape(**kw)


@dataclass(frozen=True)
class LinearPart:
    """A linear-attention part: conv state [1, channels, width] and recurrent
    state [1, heads, k_dim, v_dim], each of its own dtype."""

    channels: int
    width: int
    heads: int
    k_dim: int
    v_dim: int
    conv_dtype: torch.dtype
    state_dtype: torch.dtype

    def shape(self, length: int = 0) -> native.LinearStateShape:
        return native.LinearStateShape(conv_channels=self.channels, conv_width=self.width, state_heads=self.heads,
                                       state_k_dim=self.k_dim, state_v_dim=self.v_dim,
                                       conv_dtype=pt.element_type(self.conv_dtype),
                                       state_dtype=pt.element_type(self.state_dtype))


Part = Union[KvPart, LinearPart]


@dataclass(frozen=True)
class LayerPlan:
    """One cache layer of the model: its class name and its parts, each a
    store layer."""

    cls: str
    parts: tuple


# ---- reading a cache layer ----------------------------------------------------------


def _tensor(value, where: str, what: str, dims: int) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{where}: no {what} (a {type(value).__name__}: has the layer run?)")
    if value.dim() != dims:
        raise ValueError(f"{where}: {what} has shape {tuple(value.shape)}, not {dims}-D")
    if value.shape[0] != 1:
        raise ValueError(f"{where}: batch size {value.shape[0]}; primecache.hf stores caches of batch size 1")
    return value


def _only_state(states, where: str, what: str):
    """The one state of a linear layer (a dict {0: tensor} in transformers 5,
    or the tensor itself); several states are refused."""
    if isinstance(states, dict):
        if len(states) != 1:
            raise ValueError(f"{where}: {len(states)} {what}; primecache.hf stores layers of one state")
        return next(iter(states.values()))
    return states


def _read_kv(layer, where: str, cls: str):
    """(part, length, planes) of an attention layer or part."""
    keys = _tensor(layer.keys, where, "keys", 4)
    values = _tensor(layer.values, where, "values", 4)
    rows = keys.shape[2]
    if values.shape[2] != rows:
        raise ValueError(f"{where}: {rows} key rows but {values.shape[2]} value rows")
    if values.dtype != keys.dtype:
        raise ValueError(f"{where}: keys are {keys.dtype}, values {values.dtype}; a store layer has one dtype")
    planes = {"k_rows": keys[0].transpose(0, 1), "v_rows": values[0].transpose(0, 1)}
    window, index_dim, index_dtype, length = 0, 0, None, rows
    if cls == "DynamicSlidingWindowLayer":
        window = int(layer.sliding_window)
        if window < 2:
            raise ValueError(f"{where}: sliding window {window}; primecache.hf stores windows of 2 or more")
        length = int(layer.cumulative_length)
        if rows != min(length, window - 1):
            raise ValueError(f"{where}: holds {rows} rows after {length} tokens; a window of {window} holds "
                             f"{min(length, window - 1)}")
    elif cls == "DynamicIndexedLayer":
        index = _tensor(layer.indexer_keys, where, "indexer keys", 3)
        if index.shape[1] != rows:
            raise ValueError(f"{where}: {index.shape[1]} indexer key rows but {rows} key rows")
        index_dim, index_dtype = index.shape[2], index.dtype
        planes["index_keys"] = index[0]
    part = KvPart(k_heads=keys.shape[1], k_dim=keys.shape[3], v_heads=values.shape[1], v_dim=values.shape[3],
                  dtype=keys.dtype, window=window, index_dim=index_dim, index_dtype=index_dtype)
    return part, length, planes


def _read_linear(layer, where: str):
    """(part, planes) of a linear-attention layer or part."""
    conv = _tensor(_only_state(layer.conv_states, where, "conv states"), where, "conv state", 3)
    state = _tensor(_only_state(layer.recurrent_states, where, "recurrent states"), where, "recurrent state", 4)
    previous = getattr(layer, "has_previous_state", True)
    if not (all(previous.values()) if isinstance(previous, dict) else previous):
        raise ValueError(f"{where}: has no previous state (it has not run)")
    part = LinearPart(channels=conv.shape[1], width=conv.shape[2], heads=state.shape[1], k_dim=state.shape[2],
                      v_dim=state.shape[3], conv_dtype=conv.dtype, state_dtype=state.dtype)
    return part, {"conv_ring": conv[0], "state": state[0]}


def _read_layer(i: int, layer):
    """(LayerPlan, lengths, planes per part) of cache layer i; ValueError
    for a layer type not stored, by its class name."""
    try:
        cls = _stored_class(layer)
    except ValueError as e:
        raise ValueError(f"layer {i}: {e}") from None
    where = f"layer {i} ({cls})"
    parts, lengths, planes = [], [], []
    if cls.startswith("LinearAttention"):
        part, p = _read_linear(layer, where)
        parts.append(part)
        planes.append(p)
    if cls != "LinearAttentionLayer":
        part, length, p = _read_kv(layer, where, cls)
        parts.append(part)
        lengths.append(length)
        planes.append(p)
    return LayerPlan(cls=cls, parts=tuple(parts)), lengths, planes


def _cache_layers(cache) -> list:
    if type(cache) is not _cu.DynamicCache:
        raise ValueError(f"a cache of class {type(cache).__name__}; primecache.hf stores a DynamicCache")
    return list(cache.layers)


def _differs(have: Part, want: Part) -> str:
    """The fields in which a cache layer's part differs from the plan's."""
    fields = [f for f in want.__dataclass_fields__ if getattr(have, f) != getattr(want, f)]
    return "; ".join(f"{f} {getattr(have, f)} != model's {getattr(want, f)}" for f in fields)


# ---- the model ------------------------------------------------------------------------


def weights_digest(model, dtype: Optional[torch.dtype] = None) -> native.Hash128:
    """A 128-bit digest (BLAKE2b) of the model's config (to_json_string in
    full, less its _name_or_path and _commit_hash, which say where it was
    read from), its dtype, and every state_dict tensor's name, dtype, shape
    and bytes, in state_dict order. It reads every weight (a copy to the CPU
    per tensor): for a big model compute it once and pass it to CacheStore."""
    config = json.loads(model.config.to_json_string(use_diff=False))
    for provenance in ("_name_or_path", "_commit_hash"):
        config.pop(provenance, None)
    h = hashlib.blake2b(digest_size=16)
    h.update(b"primecache-hf-weights/1\0")
    h.update(json.dumps(config, sort_keys=True).encode())
    h.update(f"\0{dtype or model.dtype}\0".encode())
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            h.update(f"{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
            flat = tensor.detach().contiguous().reshape(-1).cpu()
            h.update(flat.view(torch.uint8).numpy().data if flat.numel() else b"")
    d = h.digest()
    return native.Hash128(lo=int.from_bytes(d[:8], "little"), hi=int.from_bytes(d[8:], "little"))


_weights_digest = weights_digest  # CacheStore's keyword of that name shadows it


def _model_device(model) -> torch.device:
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


def learn_plan(model) -> list[LayerPlan]:
    """The model's plan: a one-token forward (use_cache=True, no gradients)
    and the layers of the cache it returns. A fresh DynamicCache(config=...)
    (what a restore fills) must build the same layer classes."""
    device = _model_device(model)
    with torch.no_grad():
        out = model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=device), use_cache=True)
    cache = getattr(out, "past_key_values", None)
    if cache is None:
        raise ValueError(f"{type(model).__name__}: a forward with use_cache=True returned no cache")
    try:
        layers = _cache_layers(cache)
    except ValueError as e:
        raise ValueError(f"{type(model).__name__}'s forward returns {e}") from None
    plan = [_read_layer(i, layer)[0] for i, layer in enumerate(layers)]
    fresh = [type(l).__name__ for l in _fresh_cache(model).layers]
    made = [p.cls for p in plan]
    if fresh != made:
        raise ValueError(f"{type(model).__name__}: DynamicCache(config=model.config) builds layers {fresh}, "
                         f"its forward made {made}; primecache.hf cannot restore into the model's own cache")
    return plan


def _fresh_cache(model):
    return _cu.DynamicCache(config=model.config)


def _token_list(tokens) -> list[int]:
    if isinstance(tokens, torch.Tensor):
        if tokens.dim() == 2:
            if tokens.shape[0] != 1:
                raise ValueError(f"tokens of batch size {tokens.shape[0]}; primecache.hf stores caches of batch "
                                 f"size 1")
            tokens = tokens[0]
        if tokens.dim() != 1:
            raise ValueError(f"tokens of shape {tuple(tokens.shape)}; want [n] or [1, n]")
        return [int(t) for t in tokens.tolist()]
    return [int(t) for t in tokens]


class CacheStore:
    """Publishes and restores one model's transformers caches (a
    DynamicCache of batch size 1) through a primecache client.

    `model_id` (a ModelId from `fingerprint`) names its entries: a store of
    another model, dtype or plan finds none of them. `plan` is the model's
    LayerPlan per cache layer; `shapes(length)` the store layers a cache of
    `length` tokens has. `weights_digest`, when given, stands for
    weights_digest(model) (which reads every weight)."""

    def __init__(self, client: native.Client, model, name: Optional[str] = None,
                 weights_digest: Optional[native.Hash128] = None):
        self.client = client
        self.model = model
        self.device = _model_device(model)
        self.plan = learn_plan(model)
        shapes = self.shapes(1)
        self.fingerprint = native.ModelFingerprint(
            architecture=f"hf:{model.config.model_type}", plan_digest=native.plan_digest(shapes),
            weights_digest=weights_digest if weights_digest is not None else _weights_digest(model),
            codec_versions=native.codec_versions(shapes))
        self.model_id = native.ModelId.from_fingerprint(self.fingerprint, name or "")

    def shapes(self, length: int) -> list:
        """The store layers of a cache of `length` tokens, in order."""
        shapes = []
        for i, layer in enumerate(self.plan):
            for part in layer.parts:
                try:
                    shapes.append(part.shape(length))
                except ValueError as e:
                    raise ValueError(f"layer {i} ({layer.cls}): {e}") from None
        return shapes

    def _where(self, store_layer: int) -> str:
        """'store layer j (layer i, Class[, its linear/attention part])'."""
        j = 0
        for i, layer in enumerate(self.plan):
            for part in layer.parts:
                if j == store_layer:
                    which = ""
                    if len(layer.parts) > 1:
                        which = ", its linear part" if isinstance(part, LinearPart) else ", its attention part"
                    return f"store layer {store_layer} (layer {i}, {layer.cls}{which})"
                j += 1
        return f"store layer {store_layer}"

    # ---- publish ----------------------------------------------------------------------

    def publish(self, tokens, cache, **options) -> native.PublishResult:
        """Publishes `cache`, the model's cache after exactly `tokens` (a list
        or a [1, n] tensor), as an entry; `options` are Client.publish's
        (transform, level, chunk_bytes). The cache must match the model's
        plan layer for layer (class, widths, dtypes, window) and hold
        len(tokens) tokens; anything else is a ValueError before anything is
        sent."""
        tokens = _token_list(tokens)
        if not tokens:
            raise ValueError("no tokens: an entry covers at least one")
        layers = _cache_layers(cache)
        if len(layers) != len(self.plan):
            raise ValueError(f"the cache has {len(layers)} layers; the model has {len(self.plan)}")
        items = []
        for i, (layer, want) in enumerate(zip(layers, self.plan)):
            have, lengths, planes = _read_layer(i, layer)
            if have.cls != want.cls:
                raise ValueError(f"layer {i}: a {have.cls}; the model's is a {want.cls}")
            for part, wanted in zip(have.parts, want.parts):
                if part != wanted:
                    raise ValueError(f"layer {i} ({have.cls}): {_differs(part, wanted)}")
            for length in lengths:
                if length != len(tokens):
                    raise ValueError(f"layer {i} ({have.cls}): holds {length} tokens, not the {len(tokens)} given")
            for part, p in zip(want.parts, planes):
                items.append((part.shape(len(tokens)), p))
        return pt.publish(self.client, self.model_id, tokens, items, **options)

    # ---- lookup and restore ---------------------------------------------------------------

    def lookup(self, tokens, device=None, min_remaining: int = 1):
        """The longest stored prefix of `tokens` (a list or a [1, n] tensor)
        restored as a fresh DynamicCache on `device` (the model's by
        default): `(cache, covered_tokens)`, or `(None, 0)` on a miss. At
        least `min_remaining` tokens are left uncovered (by default 1, so
        that the forward of `tokens[covered:]` or generate(tokens,
        past_key_values=cache) has a token to give the next logits).

        Before anything is written, the entry's length and tokens and every
        stored layer's shape (kind, widths, dtypes, window, rows) must be the
        model's for that length: a ValueError names the store layer, the
        model layer and what differs. A damaged chunk raises primecache.Error;
        either way no cache is returned."""
        tokens = _token_list(tokens)
        query = tokens[:max(len(tokens) - max(min_remaining, 0), 0)]
        if not query:
            return None, 0
        hit = self.client.lookup(self.model_id, query)
        if hit is None:
            return None, 0
        covered = hit.length
        if not 1 <= covered <= len(query):
            raise ValueError(f"the daemon's hit covers {covered} tokens of a {len(query)}-token query")
        shapes = self.shapes(covered)
        try:
            detail = self.client.describe(hit.id, layer_headers=True)
        except native.NotFoundError:
            return None, 0  # evicted since the lookup
        stored_model, own = detail.info.model, self.model_id.digest
        if (stored_model.hi, stored_model.lo) != (own.hi, own.lo):
            raise ValueError(f"entry {hit.id} is of model {stored_model.hi:016x}{stored_model.lo:016x}, not this "
                             f"one's {own.hi:016x}{own.lo:016x}")
        if detail.info.length != covered or list(detail.info.tokens) != query[:covered]:
            raise ValueError(f"entry {hit.id}: its tokens are not the {covered} looked up")
        headers = [native.parse_layer_header(h) for h in detail.layer_headers]
        if len(headers) != len(shapes):
            raise ValueError(f"entry {hit.id} has {len(headers)} store layers; the model has {len(shapes)}")
        for j, (header, shape) in enumerate(zip(headers, shapes)):
            if header.shape != shape:
                raise ValueError(f"{self._where(j)}: {pt.shape_differences(header.shape, shape)}")
        device = torch.device(device) if device is not None else self.device
        destinations, tensors = {}, []
        j = 0
        for layer in self.plan:
            for part in layer.parts:
                made, planes = _empty_part(part, covered, device)
                destinations[j] = (shapes[j], planes)
                tensors.append(made)
                j += 1
        try:
            pt.fetch_into(self.client, hit.id, destinations)
        except native.NotFoundError:
            return None, 0  # evicted since the lookup; the tensors are dropped
        return self._fill(tensors, covered), covered

    def _fill(self, tensors: list, length: int):
        """A fresh DynamicCache(config=...) holding the restored tensors,
        through the layers' own update calls (so each layer's bookkeeping,
        lazy initialisation and previous-state flags are its own)."""
        cache = _fresh_cache(self.model)
        made = [type(l).__name__ for l in cache.layers]
        if made != [p.cls for p in self.plan]:
            raise ValueError(f"DynamicCache(config=model.config) now builds layers {made}, not the plan's")
        parts = iter(tensors)
        for layer, want in zip(cache.layers, self.plan):
            for part in want.parts:
                t = next(parts)
                if isinstance(part, LinearPart):
                    layer.update_conv_state(t["conv"])
                    layer.update_recurrent_state(t["state"])
                else:
                    layer.update(t["keys"], t["values"])
                    if part.window:
                        layer.cumulative_length = length
                    if part.index_dim:
                        layer.update_indexer(t["index"])
        if any(not isinstance(p, LinearPart) for lp in self.plan for p in lp.parts) and \
                cache.get_seq_length() != length:
            raise ValueError(f"the restored cache says {cache.get_seq_length()} tokens, not {length}")
        return cache


def _empty_part(part: Part, length: int, device):
    """Tensors in the cache's layout for one part, and the planes (views of
    them, in stored order) that a fetch writes."""
    if isinstance(part, LinearPart):
        conv = torch.empty((1, part.channels, part.width), dtype=part.conv_dtype, device=device)
        state = torch.empty((1, part.heads, part.k_dim, part.v_dim), dtype=part.state_dtype, device=device)
        return {"conv": conv, "state": state}, {"conv_ring": conv[0], "state": state[0]}
    rows = part.rows(length)
    keys = torch.empty((1, part.k_heads, rows, part.k_dim), dtype=part.dtype, device=device)
    values = torch.empty((1, part.v_heads, rows, part.v_dim), dtype=part.dtype, device=device)
    made = {"keys": keys, "values": values}
    planes = {"k_rows": keys[0].transpose(0, 1), "v_rows": values[0].transpose(0, 1)}
    if part.index_dim:
        index = torch.empty((1, length, part.index_dim), dtype=part.index_dtype, device=device)
        made["index"] = index
        planes["index_keys"] = index[0]
    return made, planes
