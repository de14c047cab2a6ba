"""Torch tensors in and out of primecached (docs/python.md, "Torch tensors").

A layer's planes are tensors of the shape's element types (torch.float32,
torch.bfloat16, torch.float16, torch.float8_e4m3fn where this torch has it),
on the CPU or a CUDA device, contiguous or not: a plane's values are the
tensor's elements in logical (row-major) order, so a view such as
``keys[0].transpose(0, 1)`` of a ``[heads, seq, head_dim]`` cache stands for
the token-major plane ``[seq, heads * head_dim]`` without a copy by the
caller. Every plane is checked (dtype, element count, a 2-D tensor's rows
and width) before anything is sent or written, and a refusal is a
ValueError naming the layer, the plane and what differs.

Copies: a contiguous CPU tensor is handed to the codecs as it is (publish)
or decoded into in place (fetch_into). A restore into CUDA tensors takes
raw chunks through a device window the daemon copies into, with no host
copy (fetch_into); any other tensor costs one copy through a contiguous
buffer (pinned host memory for a CUDA publish).
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence, Union

import torch

from . import _primecache as native
from ._primecache import ElementType

# torch dtype <-> element type; float8_e4m3fn only where this torch has it
# (Debian's 1.13 has not).
_TYPES = {
    torch.float32: ElementType.f32,
    torch.bfloat16: ElementType.bf16,
    torch.float16: ElementType.f16,
}
if hasattr(torch, "float8_e4m3fn"):
    _TYPES[torch.float8_e4m3fn] = ElementType.f8e4m3
_DTYPES = {v: k for k, v in _TYPES.items()}

# The integer type that carries a type's bits to NumPy, which lacks bf16 and fp8.
_CARRIER = {
    ElementType.f32: torch.float32,
    ElementType.f16: torch.float16,
    ElementType.bf16: torch.int16,
    ElementType.f8e4m3: torch.uint8,
}

PlaneTensors = Union[Mapping[str, torch.Tensor], Sequence[torch.Tensor]]


def element_type(dtype: torch.dtype) -> ElementType:
    """The element type of a torch dtype; ValueError for one planes cannot hold."""
    try:
        return _TYPES[dtype]
    except KeyError:
        names = ", ".join(str(d) for d in _TYPES)
        raise ValueError(f"{dtype} is not a plane type (one of {names})") from None


def torch_dtype(t: ElementType) -> torch.dtype:
    """The torch dtype of an element type; ValueError if this torch lacks it."""
    try:
        return _DTYPES[t]
    except KeyError:
        raise ValueError(f"this torch ({torch.__version__}) has no dtype for {t.name} planes") from None


def plane_layouts(shape) -> list[tuple[str, int, int, ElementType]]:
    """The planes of a layer of this shape, in stored order: (name, rows,
    row_width, element type)."""
    return [(p.name, p.rows, p.row_width, p.dtype) for p in native.plane_layouts(shape)]


def _check(t: torch.Tensor, rows: int, width: int, want: ElementType, where: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{where}: a {type(t).__name__}, not a torch.Tensor")
    have = _TYPES.get(t.dtype)
    if have != want:
        raise ValueError(f"{where}: dtype {t.dtype}, the plane is {want.name}")
    if t.numel() != rows * width:
        raise ValueError(f"{where}: {t.numel()} elements (shape {tuple(t.shape)}); the plane has "
                         f"{rows} rows of {width}")
    if t.dim() == 2 and tuple(t.shape) != (rows, width):
        raise ValueError(f"{where}: shape {tuple(t.shape)}; want ({rows}, {width}) or another shape "
                         f"of {rows * width} elements")


def _planes_in_order(shape, given: PlaneTensors, where: str) -> list[tuple[torch.Tensor, tuple]]:
    layouts = plane_layouts(shape)
    if isinstance(given, Mapping):
        unknown = set(given) - {name for name, *_ in layouts}
        if unknown:
            raise ValueError(f"{where}: planes {sorted(unknown)} are not its kind's")
        missing = [name for name, *_ in layouts if name not in given]
        if missing:
            raise ValueError(f"{where}: no plane '{missing[0]}'")
        tensors = [given[name] for name, *_ in layouts]
    else:
        tensors = list(given)
        if len(tensors) != len(layouts):
            raise ValueError(f"{where}: {len(tensors)} planes; its kind has {len(layouts)}")
    out = []
    for t, (name, rows, width, dtype) in zip(tensors, layouts):
        _check(t, rows, width, dtype, f"{where} plane '{name}'")
        out.append((t, (name, rows, width, dtype)))
    return out


def _as_array(t: torch.Tensor, dtype: ElementType):
    """A contiguous CPU copy (or the tensor itself) as the NumPy array the
    binding takes for this type, sharing the tensor's memory."""
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(_CARRIER[dtype]).numpy()


def publish(client: native.Client, model: native.ModelId, tokens, layers: Sequence, **options) -> native.PublishResult:
    """Publishes one layer per item of `layers`: a (shape, planes) pair,
    planes as tensors by name or in stored order. `options` are
    Client.publish's (transform, level, chunk_bytes). Every plane is checked
    before anything is sent."""
    prepared = []
    for i, item in enumerate(layers):
        shape, given = item
        planes = _planes_in_order(shape, given, f"layer {i}")
        prepared.append((shape, [_as_array(t, lay[3]) for t, lay in planes]))
    return client.publish(model, tokens, prepared, **options)


def shape_differences(stored, expected) -> str:
    """What differs between a stored shape and the cache's, field by field."""
    if type(stored) is not type(expected):
        return f"stored as a {type(stored).__name__}; the cache expects a {type(expected).__name__}"

    def fields(v):
        return [f for f in dir(v) if not f.startswith("_") and not callable(getattr(v, f))]

    def show(v):
        return v.name if isinstance(v, ElementType) else repr(v)

    diffs = [f"{f} {show(getattr(stored, f))} != cache {show(getattr(expected, f))}"
             for f in fields(stored) if getattr(stored, f) != getattr(expected, f)]
    return "stored " + "; ".join(diffs)


def _staging(t: torch.Tensor, dtype: ElementType) -> torch.Tensor:
    """Where a destination plane is decoded: the tensor itself when it is a
    contiguous CPU tensor, else a contiguous CPU buffer (pinned for CUDA)."""
    if t.device.type == "cpu" and t.is_contiguous():
        return t
    pin = t.device.type == "cuda"
    return torch.empty(t.numel(), dtype=_CARRIER[dtype], pin_memory=pin).view(t.dtype)


# Bytes of the device window each connection gives its daemon for CUDA
# restores (Client.attach_device_window).
DEVICE_WINDOW_BYTES = 256 << 20


def _device_path(client: native.Client, tensors: list) -> Optional[torch.device]:
    """The CUDA device a restore copies to through the daemon's device
    window, or None for the host path: every destination on one CUDA device,
    a CUDA runtime in this process, and a window the daemon took."""
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        return None
    device = next(iter(devices))
    if device.type != "cuda" or not native.cuda_runtime_available():
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    if client.attach_device_window(index, DEVICE_WINDOW_BYTES) is not None:
        return None
    return torch.device("cuda", index)


def _fetch_into_device(client, entry, plan, device, stats):
    """The device path: raw chunks go from the daemon's copy into the window
    to each plane by a device copy; a non-contiguous destination is filled
    through a contiguous device buffer."""
    staged, targets = {}, {}
    for layer, planes in plan.items():
        staged[layer] = []
        for t, _ in planes:
            s = t if t.is_contiguous() else torch.empty(t.numel(), dtype=t.dtype, device=device)
            staged[layer].append((s, t))
        targets[layer] = [(s.data_ptr(), s.numel() * s.element_size()) for s, _ in staged[layer]]
    stream = torch.cuda.current_stream(device)
    headers, counts = client.fetch_into_device(entry, targets, device=device.index, stream=stream.cuda_stream,
                                               window_bytes=DEVICE_WINDOW_BYTES)
    for planes in staged.values():
        for s, t in planes:
            if s is not t:
                t.copy_(s.view(t.shape))
    if stats is not None:
        stats.update(path="device window", **counts)
    return headers


def fetch_into(client: native.Client, entry: int, layers: Mapping[int, tuple],
               stats: Optional[dict] = None) -> dict[int, native.LayerHeader]:
    """Restores layers of `entry` into tensors the caller owns:
    {layer: (shape, planes)}, shape the layer's expected shape (the cache's
    own: element types, widths, length) and planes its destination tensors
    by name or in stored order. The stored headers must equal the expected
    shapes, and every destination fit, before anything is written.

    Then, when every destination is on one CUDA device and the daemon makes
    device copies, raw chunks reach the device with no host copy: the daemon
    copies them into a device window this connection gave it, and the device
    copies them on into the planes (other chunks are decoded on the host and
    copied up); the call returns once every copy ran. Otherwise each plane
    is decoded on the host into its tensor (into a CPU staging buffer first,
    and copied, when the tensor is not contiguous on the CPU; a CUDA
    tensor's copy is queued on the current stream, so work queued after this
    call sees the restored values). `stats`, a dict, gets the path taken and
    the chunks each way. A damaged chunk raises primecache.Error with the
    destinations partly written: discard them. Returns the layers'
    headers."""
    detail = client.describe(entry, layer_headers=True)
    headers = [native.parse_layer_header(h) for h in detail.layer_headers]
    plan = {}
    for layer, (shape, given) in layers.items():
        where = f"layer {layer}"
        if not 0 <= layer < len(headers):
            raise ValueError(f"{where}: the entry has {len(headers)} layers")
        if headers[layer].shape != shape:
            raise ValueError(f"{where}: {shape_differences(headers[layer].shape, shape)}")
        plan[layer] = _planes_in_order(shape, given, where)
    device = _device_path(client, [t for planes in plan.values() for t, _ in planes])
    if device is not None:
        return _fetch_into_device(client, entry, plan, device, stats)
    staged = {layer: [(_staging(t, lay[3]), t, lay) for t, lay in planes] for layer, planes in plan.items()}
    arrays = {layer: [s.reshape(-1).view(_CARRIER[lay[3]]).numpy() for s, _, lay in planes]
              for layer, planes in staged.items()}
    got = client.fetch_into(entry, arrays)
    for planes in staged.values():
        for s, t, _ in planes:
            if s is not t:
                # From pinned memory: queued on the current stream (torch's
                # pinned allocator keeps the buffer until the copy is done).
                t.copy_(s.view(t.shape), non_blocking=t.device.type == "cuda")
    if stats is not None:
        stats.update(path="host", device_chunks=0,
                     host_chunks=sum(len(r.chunks) for h in got.values() for r in h.planes))
    return got


def fetch(client: native.Client, entry: int, layers: Optional[Sequence[int]] = None,
          device: Union[str, torch.device] = "cpu") -> list[tuple[object, dict[str, torch.Tensor]]]:
    """An entry's layers (all, or the given indices) as (shape, {plane:
    tensor}) pairs, each plane a fresh [rows, row_width] tensor of its type
    on `device`."""
    detail = client.describe(entry, layer_headers=True)
    headers = [native.parse_layer_header(h) for h in detail.layer_headers]
    which = range(len(headers)) if layers is None else layers
    out, dests = [], {}
    for layer in which:
        shape = headers[layer].shape
        planes = {name: torch.empty((rows, width), dtype=torch_dtype(dtype), device=device)
                  for name, rows, width, dtype in plane_layouts(shape)}
        out.append((shape, planes))
        dests[layer] = (shape, planes)
    fetch_into(client, entry, dests)
    return out
