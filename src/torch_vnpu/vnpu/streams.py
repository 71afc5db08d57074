"""vnpu streams and events (mirror ``torch.cuda.Stream`` / ``torch.cuda.Event``).

A Stream is an in-order queue of device work run by its own worker thread;
work on different streams may overlap. ``Stream.wait_event``/``wait_stream``
create cross-stream dependencies without blocking the host.
"""

from typing import Optional

import torch

from .. import _C


def _device_index(device) -> int:
    from . import _get_device_index

    return _get_device_index(device)


class Stream(torch.Stream):
    """A vnpu stream; ``Stream(device=None, priority=0)`` creates a new one.

    priority: 0 (low, default) or -1 (high), as ``torch.cuda.Stream``.
    Subclass of ``torch.Stream``, so device-agnostic code accepts it.
    """

    def __new__(cls, device=None, priority: int = 0, **kwargs):
        if {"stream_id", "device_index", "device_type"} <= kwargs.keys():
            return super().__new__(cls, **kwargs)
        return super().__new__(cls, device=torch.device("vnpu", _device_index(device)), priority=priority)

    @property
    def vnpu_stream(self) -> int:
        """The runtime's ``vnpuStream_t`` of this stream as an int (``torch.cuda.Stream.cuda_stream``'s
        counterpart); memory snapshots name streams by it."""
        return _C._stream_handle(self.stream_id, self.device_index, self.device_type)

    @property
    def priority(self) -> int:
        return _C._stream_priority(self.stream_id, self.device_index, self.device_type)

    def record_event(self, event: Optional["Event"] = None) -> "Event":
        """Records ``event`` (a new ``Event`` if None) on this stream and returns it."""
        if event is None:
            event = Event()
        event.record(self)
        return event

    def wait_stream(self, stream: torch.Stream) -> None:
        """Makes future work on this stream wait for work queued on ``stream`` so far."""
        self.wait_event(stream.record_event())

    def __repr__(self) -> str:
        return f"<torch.vnpu.Stream device=vnpu:{self.device_index} stream_id={self.stream_id}>"


class ExternalStream(Stream):
    """A stream created outside torch, as ``torch.cuda.ExternalStream``: ``stream_ptr`` is the ``vnpuStream_t`` (an
    int) of a live stream that another library made with the runtime's ``vnpuStreamCreate``; torch queues work on
    it and never destroys it (the library must keep it alive while torch uses it).

    Raises ValueError for a value that is no live vnpu stream of this process, or a stream of another device
    than ``device`` (default: the current device).
    """

    def __new__(cls, stream_ptr: int, device=None, **kwargs):
        stream_id, device_index, device_type = _C._stream_from_external(int(stream_ptr), _device_index(device))
        return super().__new__(cls, stream_id=stream_id, device_index=device_index, device_type=device_type)


def get_stream_from_external(data_ptr: int, device=None) -> Stream:
    """A :class:`Stream` for the external ``vnpuStream_t`` ``data_ptr`` (``torch.cuda.get_stream_from_external``;
    see :class:`ExternalStream` for ownership and errors)."""
    return ExternalStream(data_ptr, device)


class Event(torch.Event):
    """A vnpu event: ``Event(enable_timing=False, blocking=False, interprocess=False)``.

    ``elapsed_time(end)`` returns milliseconds (float) between two completed
    events recorded with ``enable_timing=True``; raises RuntimeError otherwise.
    """

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        return super().__new__(
            cls, device=torch.device("vnpu", _device_index(None)), enable_timing=enable_timing,
            blocking=blocking, interprocess=interprocess,
        )


    def elapsed_time(self, end_event: "Event") -> float:
        """Milliseconds from this event to ``end_event`` (both recorded with timing and completed)."""
        return _C._event_elapsed_time(self, end_event)


def _wrap(triple) -> Stream:
    stream_id, device_index, device_type = triple
    return Stream(stream_id=stream_id, device_index=device_index, device_type=device_type)


def current_stream(device=None) -> Stream:
    """The current stream of ``device`` for this thread (initially the default stream)."""
    return _wrap(_C._current_stream(_device_index(device)))


def default_stream(device=None) -> Stream:
    """The default stream of ``device``."""
    return _wrap(_C._default_stream(_device_index(device)))


def set_stream(stream: torch.Stream) -> None:
    """Makes ``stream`` current for its device on this thread."""
    if stream is None:
        return
    _C._set_stream(stream.stream_id, stream.device_index, stream.device_type)


class StreamContext:
    """Context manager selecting a stream (and its device), like ``torch.cuda.StreamContext``."""

    def __init__(self, stream: Optional[torch.Stream]):
        self.stream = stream
        self.prev_stream = None
        self.prev_device = None

    def __enter__(self):
        if self.stream is None:
            return
        from . import _C as C

        self.prev_device = int(C._exchange_device(self.stream.device_index))
        self.prev_stream = current_stream(self.stream.device_index)
        set_stream(self.stream)

    def __exit__(self, *args):
        if self.stream is None:
            return
        set_stream(self.prev_stream)
        _C._set_device(self.prev_device)


def stream(stream: Optional[torch.Stream]) -> StreamContext:
    """``with torch.vnpu.stream(s):`` runs the block's vnpu work on ``s``."""
    return StreamContext(stream)
