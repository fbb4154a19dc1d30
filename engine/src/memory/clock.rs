//! Streams, events and the clock that orders them.

/// An execution stream (a CUDA stream, or a CPU worker queue); `StreamId::DEFAULT` is stream 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub u64);

impl StreamId {
    /// The default stream, which owns the pool's fast path.
    pub const DEFAULT: StreamId = StreamId(0);
}

/// A point recorded on one stream (an event); epochs on one stream increase monotonically.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId(pub u64);

/// Records and queries points on streams; a CUDA backend implements it with events.
pub trait StreamClock: Send + Sync {
    /// Records a new point on `stream` after all work enqueued so far, and returns it.
    fn record(&self, stream: StreamId) -> EventId;
    /// Whether `stream` has executed past `epoch` (an id returned by `record` for it).
    fn is_complete(&self, stream: StreamId, epoch: EventId) -> bool;
    /// Whether a graph capture is in progress (no events may be queried then).
    fn capturing(&self) -> bool;
    /// Orders `waiter`'s later work after `stream` passes `epoch`, on the device and without
    /// waiting on the host (a CUDA stream waiting on an event); false when the clock cannot, or
    /// does not know either stream. Lets a pool hand one stream's free span to another at once.
    fn order_after(&self, waiter: StreamId, stream: StreamId, epoch: EventId) -> bool {
        let _ = (waiter, stream, epoch);
        false
    }
    /// Whether [`Self::order_after`] can order streams at all. A pool over a region that moves
    /// pages in the background then hands spans between streams and never promotes them.
    fn orders_streams(&self) -> bool {
        false
    }
}

/// The clock of synchronous execution (the CPU backend): every recorded point is already passed.
#[derive(Debug, Default, Clone, Copy)]
pub struct SyncClock;

impl StreamClock for SyncClock {
    fn record(&self, _stream: StreamId) -> EventId {
        EventId(0)
    }

    fn is_complete(&self, _stream: StreamId, _epoch: EventId) -> bool {
        true
    }

    fn capturing(&self) -> bool {
        false
    }
}
