//! The slow paths between streams: pending spans, hand-overs and promotions.

use super::*;
impl<R: Region> FixedPool<R> {
    /// [`Self::alloc_in`] when no listed span fits: reclaims pending spans, promotes other
    /// streams' spans, moves pages (in page mode), or reports the pool's state. Kept out of
    /// line so that the common path stays small.
    #[cold]
    #[inline(never)]
    pub(super) fn alloc_slow(
        &self,
        g: &mut Inner,
        requested: usize,
        units: usize,
        (stream, own): (StreamId, Option<u8>),
    ) -> Result<u32> {
        // Spans kept apart from this stream's own first (no event needed), then pending spans
        // whose streams passed, then other streams' spans.
        let mut found = None;
        if let Some(t) = own.filter(|_| g.may_keep_apart()) {
            if g.consolidate(t) {
                found = g.take_cold(units, own);
            }
        }
        if found.is_none() && self.pending_count.load(Ordering::Acquire) > 0 {
            self.reclaim(g);
            found = Self::retake(g, units, own);
        }
        // Page mode: spans that cross between streams every few allocations (streams taking
        // turns on too few pages to keep a span each, as in the two-stream pair) cost an event
        // and a device-side wait, or an event recorded and queried, every time; backing this
        // stream's block from the reserve ends that for good.
        if found.is_none() && g.page_units > 0 && g.close_crossings >= CLOSE_CROSSINGS {
            g.close_crossings = 0;
            found = self.remap_take(g, units, (stream, own), true)?;
        }
        // Background moves (stream-ordered, like cudaMallocAsync): a pending span, or a span or
        // run of spans kept for other streams, that fits is handed over at once, this stream
        // ordered on the device after those streams' points, instead of moving pages for the
        // block (two page operations a page, tens of µs each on the mover) or waiting on the
        // host for the streams to pass (a promotion fails while they are busy). A point an
        // idle stream has passed adds no wait on the device.
        if found.is_none() && g.background {
            if let Some(t) = own {
                if self.adopt_pending(g, (stream, t), units)
                    || self.adopt_foreign(g, (stream, t), units)
                {
                    found = g.take_cold(units, own);
                }
            }
        }
        // With a clock that orders streams, a background pool promotes nothing: a promoted span
        // stays pending until its stream passes a point, which a stream held behind the mover
        // passes late, and meanwhile the pool maps new pages. The hand-overs above and the page
        // takes of `remap_take` serve without waiting (two-stream window: 1.14-1.20 reserved /
        // live on the H200 with promotions; 1.110 without, over the fakes, however late events
        // complete).
        let promote = !(g.background && self.clock.orders_streams());
        if found.is_none() && promote && self.promote_foreign(g, own) {
            self.reclaim(g);
            found = Self::retake(g, units, own);
            if found.is_some() {
                g.note_crossing();
            }
        }
        // Background moves: free spans kept for a stream held on the device behind a move are
        // not promoted (their point would pass only after the mover). Waiting briefly for the
        // mover, then promoting them, beats moving more pages: each move adds tens of µs of
        // mover time, and stream-alternating work would otherwise move pages every step.
        if found.is_none()
            && promote
            && g.background
            && self.held_foreign_spans(g, own)
            && self.region.settle_within(MOVER_WAIT)?
            && self.promote_foreign(g, own)
        {
            self.reclaim(g);
            found = Self::retake(g, units, own);
            if found.is_some() {
                g.note_crossing();
            }
        }
        if found.is_none() && g.page_units > 0 {
            found = self.remap_take(g, units, (stream, own), false)?;
        }
        found.ok_or_else(|| {
            let full = if g.span_room() < 3 {
                " (full: raise max_spans)"
            } else {
                ""
            };
            let table = format!(
                "; span table {} of {} entries used{full}",
                g.span_cap - g.span_room(),
                g.span_cap
            );
            Error::OutOfMemory(format!(
                "pool exhausted: requested {requested} B ({} B aligned) on stream {}; \
                 reserved {} B, in use {} B in {} blocks, free {} B, largest free block {} B, \
                 pending {} B{table}",
                units << self.shift,
                stream.0,
                self.reserved,
                g.in_use << self.shift,
                g.blocks,
                g.free_units << self.shift,
                g.largest_free() << self.shift,
                g.pending_units << self.shift
            ))
        })
    }

    /// [`Inner::take`] after spans came back to the free lists: merges them with the stream's
    /// own first where spans may have been kept apart ([`Inner::may_keep_apart`]).
    pub(super) fn retake(g: &mut Inner, units: usize, own: Option<u8>) -> Option<u32> {
        if let Some(t) = own.filter(|_| g.may_keep_apart()) {
            g.consolidate(t);
        }
        g.take_cold(units, own)
    }

    /// Moves pending spans whose streams have all passed their epochs to the free lists.
    /// Queries nothing during capture.
    pub(super) fn reclaim(&self, g: &mut Inner) {
        if self.clock.capturing() {
            return;
        }
        // Per stream tag: 0 unknown, 1 complete, 2 not complete (for the epoch asked first).
        let mut known: [(EventId, u8); MAX_STREAMS] = [(EventId(0), 0); MAX_STREAMS];
        let mut k = 0;
        while k < g.pending.len() {
            let p = g.pending[k];
            let mut done = true;
            for b in set_bits(p.mask) {
                let epoch = p.epochs[b];
                let c = match known[b] {
                    (e, 1) if e >= epoch => true,
                    (e, 2) if e <= epoch => false,
                    _ => {
                        let c = self.clock.is_complete(g.streams[b], epoch);
                        known[b] = (epoch, if c { 1 } else { 2 });
                        c
                    }
                };
                if !c {
                    done = false;
                    break;
                }
            }
            if done {
                g.pending.swap_remove(k);
                let size = g.nodes[p.node as usize].size;
                g.pending_units -= size;
                self.pending_count.fetch_sub(1, Ordering::AcqRel);
                g.release_cold(p.node, p.tag);
            } else {
                k += 1;
            }
        }
    }

    /// Hands stream tag `own` (stream `stream`) the smallest pending span holding `units`,
    /// ordered on the device after the points it waits for (already recorded, so no event is
    /// recorded here). Returns whether one was.
    pub(super) fn adopt_pending(
        &self,
        g: &mut Inner,
        (stream, own): (StreamId, u8),
        units: usize,
    ) -> bool {
        if self.clock.capturing() || !self.stream_safe {
            return false;
        }
        let best = (0..g.pending.len())
            .filter(|&k| g.nodes[g.pending[k].node as usize].size >= units)
            .min_by_key(|&k| {
                let n = &g.nodes[g.pending[k].node as usize];
                (n.size, n.off)
            });
        let Some(k) = best else {
            return false;
        };
        let p = g.pending[k];
        for b in set_bits(p.mask) {
            if !self.clock.order_after(stream, g.streams[b], p.epochs[b]) {
                return false;
            }
        }
        g.pending.swap_remove(k);
        g.pending_units -= g.nodes[p.node as usize].size;
        self.pending_count.fetch_sub(1, Ordering::AcqRel);
        g.release_cold(p.node, own);
        g.note_handover();
        true
    }

    /// Hands stream tag `own` (stream `stream`) the best fit for `units` among the free spans
    /// kept for other streams, or else the smallest run of adjacent free spans that holds it
    /// ([`Inner::free_run_for`]): its stream is ordered on the device after a point recorded
    /// now on each giving stream ([`StreamClock::order_after`]), so neither the host nor the
    /// mover waits. Only those spans change hands; the other streams keep the rest. Returns
    /// whether any did (never during capture, or with a clock that cannot order streams).
    pub(super) fn adopt_foreign(
        &self,
        g: &mut Inner,
        (stream, own): (StreamId, u8),
        units: usize,
    ) -> bool {
        if self.clock.capturing() || !self.stream_safe {
            return false;
        }
        let class = mapping(units);
        let mut best: Option<(usize, usize, u32, u8)> = None;
        for t in 1..g.index.len() as u8 {
            if t == own {
                continue;
            }
            if let Some((size, off, i)) = g.best_in(t, units, class) {
                if best.is_none_or(|b| (size, off) < (b.0, b.1)) {
                    best = Some((size, off, i, t));
                }
            }
        }
        let mut s = std::mem::take(&mut g.moves);
        s.window.clear();
        match best {
            Some((_, _, i, _)) => s.window.push(i),
            None => {
                g.address_order(&mut s.order);
                if let Some((a, b)) = g.free_run_for(&s.order, units, own) {
                    s.window.extend_from_slice(&s.order[a..=b]);
                }
            }
        }
        s.points.clear();
        let handed =
            !s.window.is_empty() && self.hand_over(g, (stream, own), &s.window, &mut s.points);
        g.moves = s;
        handed
    }

    /// [`Self::adopt_foreign`] once the spans are chosen: orders `stream` after a point on
    /// each stream that keeps one of `run` (free spans in address order), then releases them
    /// to stream tag `own`. Returns whether it could order the streams.
    pub(super) fn hand_over(
        &self,
        g: &mut Inner,
        (stream, own): (StreamId, u8),
        run: &[u32],
        points: &mut Vec<(u8, StreamId, EventId)>,
    ) -> bool {
        let tags = g.foreign_tags(run, own);
        if !self.order_after_streams(g, stream, tags, points) {
            return false;
        }
        for &i in run {
            // A span merged into an earlier one of the run (its node dropped) is skipped.
            if g.nodes[i as usize].state == State::Free {
                g.unlink_free(i);
                g.release_cold(i, own);
            }
        }
        g.note_handover();
        true
    }

    /// Orders `stream` on the device after a point recorded now on each stream in `tags` (bit
    /// `t - 1` for tag `t`: one event and one device-side wait each), noting the points in
    /// `points`. False if the clock could not order one.
    pub(super) fn order_after_streams(
        &self,
        g: &mut Inner,
        stream: StreamId,
        tags: u64,
        points: &mut Vec<(u8, StreamId, EventId)>,
    ) -> bool {
        for b in set_bits(tags) {
            let t = b as u8 + 1;
            let e = g.epoch_for_fresh(self.clock.as_ref(), t);
            points.push((t, g.streams[b], e));
            if !self.clock.order_after(stream, g.streams[b], e) {
                return false;
            }
        }
        true
    }

    /// Whether a stream other than `own` keeps free spans and waits on the device behind a
    /// background page move (so [`Self::promote_foreign`] passes it over).
    pub(super) fn held_foreign_spans(&self, g: &Inner, own: Option<u8>) -> bool {
        (1..g.index.len() as u8).any(|t| {
            Some(t) != own
                && g.index[t as usize].fl_bitmap != 0
                && self.region.stream_waits_on_moves(g.streams[t as usize - 1])
        })
    }

    /// Makes spans reserved for other streams available to every stream once those streams
    /// pass a freshly recorded point (one event per stream). Returns whether any moved.
    pub(super) fn promote_foreign(&self, g: &mut Inner, own: Option<u8>) -> bool {
        if self.clock.capturing() || !self.stream_safe {
            return false;
        }
        let mut moved = false;
        for t in 1..g.index.len() as u8 {
            if Some(t) == own || g.index[t as usize].fl_bitmap == 0 {
                continue;
            }
            // A stream held behind background page moves would keep its spans pending until
            // the mover catches up; they stay where they are, and give pages instead.
            if g.background && self.region.stream_waits_on_moves(g.streams[t as usize - 1]) {
                continue;
            }
            let epoch = g.epoch_for_fresh(self.clock.as_ref(), t);
            // Take every span of tag t out of its lists.
            let mut kept = std::mem::take(&mut g.kept);
            g.spans_of(t, &mut kept);
            for &i in &kept {
                g.unlink_free(i);
                g.nodes[i as usize].state = State::Pending;
                g.pending_units += g.nodes[i as usize].size;
                self.pending_count.fetch_add(1, Ordering::AcqRel);
                let mut epochs = [EventId(0); MAX_STREAMS];
                epochs[t as usize - 1] = epoch;
                g.pending.push(Pending {
                    node: i,
                    tag: ANY,
                    mask: 1 << (t - 1),
                    epochs,
                });
                moved = true;
            }
            g.kept = kept;
        }
        moved
    }
}
