//! Page mode: moving physical pages behind free spans so a block fits without growing.

use super::*;
/// The working lists of page moves and hand-overs, kept in the pool between calls: once grown
/// to the pool's span count they are only cleared and refilled, so neither slow path calls the
/// system allocator in the steady state (`tests/pool_slow_paths_alloc.rs`).
#[derive(Default)]
pub(super) struct MoveScratch {
    /// Every span in address order ([`Inner::address_order`]).
    pub(super) order: Vec<u32>,
    /// The spans a block is placed on: a page move's window, or the spans handed over.
    pub(super) window: Vec<u32>,
    /// [`Inner::remap_plan`]'s candidate windows: (pages to map, first and last index in
    /// `order`).
    pub(super) windows: Vec<(usize, usize, usize)>,
    /// [`Inner::donor_runs`]: (bytes, first page, pages, stream tag mask) per run.
    pub(super) donors: Vec<(usize, usize, usize, u64)>,
    /// The page ranges a move unbacks: first page, pages, the donor spans' stream tags as a
    /// mask (bit `t - 1` for tag `t`).
    pub(super) steals: Vec<(usize, usize, u64)>,
    /// One point recorded on each stream whose kept span gives pages: (tag, stream, point).
    pub(super) points: Vec<(u8, StreamId, EventId)>,
    /// The points one unbacked range waits for.
    pub(super) after: Vec<(StreamId, EventId)>,
    /// Page ranges (first page, pages) a move unbacked and backed.
    pub(super) unbacked: Vec<(usize, usize)>,
    pub(super) backed: Vec<(usize, usize)>,
}

impl MoveScratch {
    /// Lists sized for `spans` spans and every stream, so a first move allocates nothing either.
    pub(super) fn with_capacity(spans: usize) -> Self {
        MoveScratch {
            order: Vec::with_capacity(spans),
            window: Vec::with_capacity(spans),
            windows: Vec::with_capacity(spans),
            donors: Vec::with_capacity(spans),
            steals: Vec::with_capacity(spans),
            points: Vec::with_capacity(MAX_STREAMS),
            after: Vec::with_capacity(MAX_STREAMS),
            unbacked: Vec::with_capacity(spans),
            backed: Vec::with_capacity(spans),
        }
    }
}
impl<R: Region> FixedPool<R> {
    /// Page mode, when no backed free span fits: places `size` units on a run of free spans
    /// usable by `own` and unbacked ranges ([`Inner::remap_plan`]), backing its unbacked pages
    /// with pages unbacked from free spans no queued work can touch, or from the region's
    /// unused reserve, and returns the used node. It stays within the footprint so far if it
    /// can, then promotes spans kept for one stream and tries again, and grows the footprint
    /// only last. `None` when even that cannot hold the block (the promoted spans may serve a
    /// later call once their streams pass). With `grow_first` it grows at once: the block on
    /// this stream's spans and unbacked ranges, backed from any-stream free spans and then the
    /// reserve, no other stream's span touched.
    #[cold]
    #[inline(never)]
    pub(super) fn remap_take(
        &self,
        g: &mut Inner,
        size: usize,
        (stream, own): (StreamId, Option<u8>),
        grow_first: bool,
    ) -> Result<Option<u32>> {
        let mut s = std::mem::take(&mut g.moves);
        let taken = self.remap_take_with(g, &mut s, size, (stream, own), grow_first);
        g.moves = s;
        taken
    }

    /// [`Self::remap_take`] with its working lists `s` taken out of `g`.
    pub(super) fn remap_take_with(
        &self,
        g: &mut Inner,
        s: &mut MoveScratch,
        size: usize,
        (stream, own): (StreamId, Option<u8>),
        grow_first: bool,
    ) -> Result<Option<u32>> {
        let key = (size, own.unwrap_or(ANY));
        if grow_first {
            s.points.clear();
            if !g.remap_plan(key, true, (false, false), s) {
                return Ok(None);
            }
            return self.remap_apply(g, s, size);
        }
        // With a clock that orders streams, the second try may also place the block over free
        // spans kept for other streams, the allocating stream ordered after a point on each
        // (as a hand-over): fewer pages move, and the footprint stays nearer the live bytes.
        let mut foreign = g.background
            && self.stream_safe
            && own.is_some()
            && !self.clock.capturing()
            && self.clock.orders_streams();
        loop {
            s.points.clear();
            let Some(tags) = self.remap_plan_tries(g, s, key, foreign) else {
                return Ok(None);
            };
            // The allocating stream ordered after a point on each other stream whose span the
            // window takes.
            if self.order_after_streams(g, stream, tags, &mut s.points) {
                break;
            }
            foreign = false;
        }
        self.remap_apply(g, s, size)
    }

    /// Carries out the plan in `s` (from [`Self::remap_plan_tries`] or [`Inner::remap_plan`],
    /// with the points the window ordered the allocating stream after in `s.points`): unbacks
    /// the donors' pages, backs the window's, and returns the block's node.
    pub(super) fn remap_apply(
        &self,
        g: &mut Inner,
        s: &mut MoveScratch,
        size: usize,
    ) -> Result<Option<u32>> {
        // Each unbacked range splits at most two spans, and the window leaves at most three
        // nodes: with less room in the span table the move is not started.
        if g.span_room() < 2 * s.steals.len() + 3 {
            return Ok(None);
        }
        let pu = g.page_units;
        // One point recorded now on each stream whose kept span gives pages (the window's
        // points serve too).
        for &(_, _, tags) in &s.steals {
            for b in set_bits(tags) {
                let t = b as u8 + 1;
                if !s.points.iter().any(|p| p.0 == t) {
                    let e = g.epoch_for_fresh(self.clock.as_ref(), t);
                    s.points.push((t, g.streams[t as usize - 1], e));
                }
            }
        }
        // Unback the donors' pages (the region's side; the spans change below).
        s.unbacked.clear();
        let mut failed = None;
        for &(first, count, tags) in &s.steals {
            s.after.clear();
            s.after.extend(
                s.points
                    .iter()
                    .filter(|p| tags & (1 << (p.0 - 1)) != 0)
                    .map(|p| (p.1, p.2)),
            );
            match self.region.unmap_pages_after(first, count, &s.after) {
                Ok(()) => s.unbacked.push((first, count)),
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        // Back the window's unbacked pages, undoing this call's maps if one fails.
        let start = g.nodes[s.window[0] as usize].off;
        let end = start + size;
        s.backed.clear();
        if failed.is_none() {
            for &k in &s.window {
                let m = g.nodes[k as usize];
                if m.state != State::Unmapped {
                    continue;
                }
                let (p0, p1) = (m.off / pu, (m.off + m.size).min(end).div_ceil(pu));
                if let Err(e) = self.region.map_pages(p0, p1 - p0) {
                    for &(q0, n) in &s.backed {
                        let _ = self.region.unmap_pages(q0, n);
                    }
                    s.backed.clear();
                    failed = Some(e);
                    break;
                }
                s.backed.push((p0, p1 - p0));
            }
        }
        let used = match failed {
            None => {
                g.remaps += 1;
                // Pages or spans kept for another stream served this one: a crossing.
                if !s.points.is_empty() {
                    g.note_crossing();
                }
                Some(g.fill_window(&s.window, size, pu))
            }
            Some(_) => None,
        };
        for &(first, count) in &s.unbacked {
            g.unback_free(first * pu, count * pu, &mut s.order);
            g.phys_free += count;
            g.mapped -= count;
            g.page_unmaps += count as u64;
        }
        for &(_, count) in &s.backed {
            g.phys_free -= count;
            g.mapped += count;
            g.page_maps += count as u64;
        }
        g.peak_mapped = g.peak_mapped.max(g.mapped);
        g.merge_unmapped_runs(&mut s.order);
        match (used, failed) {
            (Some(used), _) => {
                g.note_extent(start, size);
                Ok(Some(used))
            }
            (None, Some(e)) => Err(e),
            (None, None) => Ok(None),
        }
    }

    /// [`Self::remap_take`]'s plan into `s.window` and `s.steals`: within the footprint so far
    /// first; then with spans kept for one stream made any stream's (once a point recorded on
    /// it now has passed; no event during capture); only then growing the footprint from the
    /// reserve. In background mode spans kept for a stream give pages at the second try
    /// instead of being promoted (not during capture, when no point may be recorded): the
    /// mover unbacks them once their stream passes a point recorded now; with `foreign` the
    /// window may take them too. Returns the tags (bit `t - 1` for tag `t`) of the other
    /// streams' spans in the window, `None` if no plan serves.
    pub(super) fn remap_plan_tries(
        &self,
        g: &mut Inner,
        s: &mut MoveScratch,
        key: (usize, u8),
        foreign: bool,
    ) -> Option<u64> {
        let all_tags = g.background && !self.clock.capturing();
        let (mut reach, mut promoted) = ((false, false), false);
        loop {
            if g.remap_plan(key, false, reach, s) {
                break;
            }
            if !promoted {
                promoted = true;
                if all_tags {
                    reach = (true, foreign);
                    continue;
                }
                if !g.background && self.promote_foreign(g, None) {
                    self.reclaim(g);
                    continue;
                }
            }
            if g.remap_plan(key, true, reach, s) {
                break;
            }
            return None;
        }
        Some(g.foreign_tags(&s.window, key.1))
    }
}

impl Inner {
    /// The smallest run of two or more adjacent free spans, at least one of them kept for a
    /// stream other than `own`, holding `units` (lowest offset on ties), among `order` (every
    /// span in address order): its first and last index there. O(spans).
    pub(super) fn free_run_for(
        &self,
        order: &[u32],
        units: usize,
        own: u8,
    ) -> Option<(usize, usize)> {
        // (bytes, offset, first index, last index) of the best run so far.
        let mut best: Option<(usize, usize, usize, usize)> = None;
        // The open run: its first index, bytes (0: none open), and whether a span is foreign.
        let (mut first, mut bytes, mut foreign) = (0, 0, false);
        for k in 0..=order.len() {
            let free = order
                .get(k)
                .map(|&i| self.nodes[i as usize])
                .filter(|n| n.state == State::Free);
            if let Some(n) = free {
                if bytes == 0 {
                    first = k;
                }
                bytes += n.size;
                foreign |= n.tag != ANY && n.tag != own;
                continue;
            }
            if bytes >= units && k - first >= 2 && foreign {
                let off = self.nodes[order[first] as usize].off;
                if best.is_none_or(|b| (bytes, off) < (b.0, b.1)) {
                    best = Some((bytes, off, first, k - 1));
                }
            }
            (bytes, foreign) = (0, false);
        }
        best.map(|b| (b.2, b.3))
    }

    /// The stream tags (bit `t - 1` for tag `t`) of the spans in `spans` kept for streams other
    /// than `own` (unbacked ranges are any stream's).
    pub(super) fn foreign_tags(&self, spans: &[u32], own: u8) -> u64 {
        spans
            .iter()
            .map(|&i| self.nodes[i as usize].tag)
            .filter(|&t| t != ANY && t != own)
            .fold(0, |m, t| m | 1 << (t - 1))
    }

    /// Every span in address order, into `order` (cleared first; page mode's slow paths,
    /// O(spans)).
    pub(super) fn address_order(&self, order: &mut Vec<u32>) {
        order.clear();
        let mut cur = self
            .nodes
            .iter()
            .position(|n| n.state != State::Unused && n.off == 0)
            .map_or(NIL, |i| i as u32);
        while cur != NIL {
            order.push(cur);
            cur = self.nodes[cur as usize].next_phys;
        }
    }

    /// Page mode's plan for `size` units on stream tag `own`: the window (a run of adjacent
    /// free spans usable by `own` and unbacked ranges, the block at its start) and the page
    /// ranges to unback for it (whole pages of any-stream free spans outside the block,
    /// smallest spans first). Without `grow`, only plans within the footprint so far: reserve
    /// pages up to the most ever backed (every reserve page with
    /// [`PoolOptions::reserve_first`]), then donors; the first window, by pages needed, that
    /// this serves. With `grow`, donors first and then any reserve page: the window needing
    /// the fewest pages (or, if the reserve cannot serve it, the first that can). Neither
    /// choice depends on the reserve's size while the footprint fits in it, so a pool sized
    /// at a run's footprint repeats that run. The plan goes to `s.window` (the window's spans)
    /// and `s.steals` (the page ranges to unback); false if no window can be served.
    pub(super) fn remap_plan(
        &self,
        (size, own): (usize, u8),
        grow: bool,
        (any_tag, foreign): (bool, bool),
        s: &mut MoveScratch,
    ) -> bool {
        let pu = self.page_units;
        self.address_order(&mut s.order);
        let MoveScratch {
            order,
            window,
            windows,
            donors,
            steals,
            ..
        } = s;
        let usable = |n: &Node| match n.state {
            State::Unmapped => true,
            State::Free => foreign || compatible(n.tag, own),
            _ => false,
        };
        // (pages to map, first and last window index in `order`) for each start.
        windows.clear();
        for i in 0..order.len() {
            let first = self.nodes[order[i] as usize];
            if !usable(&first) {
                continue;
            }
            let end = first.off + size;
            let mut need = 0;
            for (j, &k) in order.iter().enumerate().skip(i) {
                let m = self.nodes[k as usize];
                if !usable(&m) {
                    break;
                }
                if m.state == State::Unmapped {
                    need += (m.off + m.size).min(end).div_ceil(pu) - m.off / pu;
                }
                if m.off + m.size >= end {
                    windows.push((need, i, j));
                    break;
                }
            }
        }
        windows.sort_unstable();
        let headroom = if self.reserve_first {
            self.phys_free
        } else {
            self.peak_mapped
                .saturating_sub(self.mapped)
                .min(self.phys_free)
        };
        let reserve = if grow { self.phys_free } else { headroom };
        for &(need, wi, wj) in windows.iter() {
            let end = self.nodes[order[wi] as usize].off + size;
            self.donor_runs(order, (wi, wj), end, any_tag, donors);
            let stealable: usize = donors.iter().map(|d| d.2).sum();
            if stealable + reserve < need {
                continue;
            }
            donors.sort_unstable();
            // Within the footprint the reserve goes first (no page to unback); growing it,
            // donors go first.
            let mut left = if grow {
                need
            } else {
                need - need.min(headroom)
            };
            steals.clear();
            for &(_, p0, pages, tags) in donors.iter() {
                if left == 0 {
                    break;
                }
                let take = pages.min(left);
                steals.push((p0 + pages - take, take, tags));
                left -= take;
            }
            window.clear();
            window.extend_from_slice(&order[wi..=wj]);
            return true;
        }
        false
    }

    /// Whole pages that free spans outside the window `order[wi..wj]` can give: runs of
    /// adjacent any-stream free spans (with `any_tag`, of every free span; spans kept for
    /// different streams do not merge, so a page may straddle several), the window's last span
    /// giving what lies past the block's `end`. Each run: (bytes of its spans, first page,
    /// pages, its spans' stream tags as a mask, bit `t - 1` for tag `t`). Without `any_tag`
    /// every run is one span (adjacent any-stream spans are always merged). Into `donors`
    /// (cleared first).
    pub(super) fn donor_runs(
        &self,
        order: &[u32],
        (wi, wj): (usize, usize),
        end: usize,
        any_tag: bool,
        donors: &mut Vec<(usize, usize, usize, u64)>,
    ) {
        let pu = self.page_units;
        donors.clear();
        // The open run: (first byte, end, bytes of its spans, tag mask).
        let mut run: Option<(usize, usize, usize, u64)> = None;
        let close = |run: &mut Option<(usize, usize, usize, u64)>,
                     donors: &mut Vec<(usize, usize, usize, u64)>| {
            if let Some((from, to, bytes, tags)) = run.take() {
                let (p0, p1) = (from.div_ceil(pu), to / pu);
                if p1 > p0 {
                    donors.push((bytes, p0, p1 - p0, tags));
                }
            }
        };
        for (k, &i) in order.iter().enumerate() {
            let n = self.nodes[i as usize];
            let gives = (k < wi || k >= wj) && n.state == State::Free && (n.tag == ANY || any_tag);
            if !gives {
                close(&mut run, donors);
                continue;
            }
            let from = if k == wj { end.max(n.off) } else { n.off };
            let bit = if n.tag == ANY { 0 } else { 1u64 << (n.tag - 1) };
            match &mut run {
                Some((_, to, bytes, tags)) if *to == from => {
                    *to = n.off + n.size;
                    *bytes += n.size;
                    *tags |= bit;
                }
                _ => {
                    close(&mut run, donors);
                    run = Some((from, n.off + n.size, n.size, bit));
                }
            }
        }
        close(&mut run, donors);
    }

    /// Marks `off..off + len` (whole pages of adjacent free spans, just unbacked) unbacked;
    /// `order` is a working list.
    pub(super) fn unback_free(&mut self, off: usize, len: usize, order: &mut Vec<u32>) {
        let end = off + len;
        self.address_order(order);
        order.retain(|&i| {
            let n = &self.nodes[i as usize];
            n.state == State::Free && n.off < end && off < n.off + n.size
        });
        for &i in order.iter() {
            let n = self.nodes[i as usize];
            let from = off.max(n.off);
            self.carve_unmapped(i, from, end.min(n.off + n.size) - from);
        }
    }

    /// Splits free span `i` around `off..off + len` (whole pages inside it, just unbacked):
    /// that range becomes an `Unmapped` span, what lies either side stays free with `i`'s tag.
    pub(super) fn carve_unmapped(&mut self, i: u32, off: usize, len: usize) {
        let n = self.nodes[i as usize];
        self.unlink_free(i);
        let free_piece = |o: usize, size: usize, prev: u32, next: u32| Node {
            prev_phys: prev,
            next_phys: next,
            ..Node::span(o, size, n.tag, State::Free)
        };
        let mut prev = n.prev_phys;
        if off > n.off {
            let head = self.new_node(free_piece(n.off, off - n.off, n.prev_phys, i));
            if n.prev_phys != NIL {
                self.nodes[n.prev_phys as usize].next_phys = head;
            }
            self.link_free(head);
            prev = head;
        }
        let mut next = n.next_phys;
        if off + len < n.off + n.size {
            let tail_off = off + len;
            let tail = self.new_node(free_piece(tail_off, n.off + n.size - tail_off, i, next));
            if next != NIL {
                self.nodes[next as usize].prev_phys = tail;
            }
            self.link_free(tail);
            next = tail;
        }
        let node = &mut self.nodes[i as usize];
        node.off = off;
        node.size = len;
        node.prev_phys = prev;
        node.next_phys = next;
        node.state = State::Unmapped;
        node.tag = ANY;
    }

    /// Replaces the run of spans `window` (free spans and backed-for-this `Unmapped` ones,
    /// adjacent, in address order) with one used node of `size` units at the run's start;
    /// the rest of the last span stays free (the backed part of an unbacked span, free for any
    /// stream) or unbacked.
    pub(super) fn fill_window(&mut self, window: &[u32], size: usize, pu: usize) -> u32 {
        let first = self.nodes[window[0] as usize];
        let last = self.nodes[window[window.len() - 1] as usize];
        let (start, end, last_end) = (first.off, first.off + size, last.off + last.size);
        for &k in window {
            if self.nodes[k as usize].state == State::Free {
                self.unlink_free(k);
            }
            self.drop_node(k);
        }
        let blank = Node::span;
        // The used node, then what is left of the last span: at most three nodes.
        let mut chain = [NIL; 3];
        let mut len = 1;
        chain[0] = self.new_node(blank(start, size, ANY, State::Used));
        let mut rest = None;
        if last_end > end {
            if last.state == State::Free {
                let r = self.new_node(blank(end, last_end - end, last.tag, State::Used));
                (chain[len], len) = (r, len + 1);
                rest = Some((r, last.tag));
            } else {
                let backed_end = end.div_ceil(pu) * pu;
                if backed_end > end {
                    let r = self.new_node(blank(end, backed_end - end, ANY, State::Used));
                    (chain[len], len) = (r, len + 1);
                    rest = Some((r, ANY));
                }
                if last_end > backed_end {
                    let u = blank(backed_end, last_end - backed_end, ANY, State::Unmapped);
                    (chain[len], len) = (self.new_node(u), len + 1);
                }
            }
        }
        let mut prev = first.prev_phys;
        for &k in &chain[..len] {
            self.nodes[k as usize].prev_phys = prev;
            if prev != NIL {
                self.nodes[prev as usize].next_phys = k;
            }
            prev = k;
        }
        self.nodes[prev as usize].next_phys = last.next_phys;
        if last.next_phys != NIL {
            self.nodes[last.next_phys as usize].prev_phys = prev;
        }
        if let Some((r, tag)) = rest {
            // Not yet linked; `release` links it, merging a free neighbour on its right.
            self.release_cold(r, tag);
        }
        chain[0]
    }

    /// Merges adjacent `Unmapped` spans (left by unbacking next to an unbacked range); `order`
    /// is a working list.
    pub(super) fn merge_unmapped_runs(&mut self, order: &mut Vec<u32>) {
        self.address_order(order);
        let mut k = 0;
        while k < order.len() {
            let a = order[k];
            let mut j = k + 1;
            while self.nodes[a as usize].state == State::Unmapped
                && j < order.len()
                && self.nodes[order[j] as usize].state == State::Unmapped
            {
                let b = order[j];
                let bn = self.nodes[b as usize];
                self.nodes[a as usize].size += bn.size;
                self.nodes[a as usize].next_phys = bn.next_phys;
                if bn.next_phys != NIL {
                    self.nodes[bn.next_phys as usize].prev_phys = a;
                }
                self.drop_node(b);
                j += 1;
            }
            k = j;
        }
    }

    /// Every free span reserved for stream tag `t`, into `spans` (cleared first).
    pub(super) fn spans_of(&self, t: u8, spans: &mut Vec<u32>) {
        let idx = &self.index[t as usize];
        spans.clear();
        let mut fls = idx.fl_bitmap;
        while fls != 0 {
            let fl = fls.trailing_zeros() as usize;
            fls &= fls - 1;
            let mut sls = idx.sl_bitmap[fl];
            while sls != 0 {
                let sl = sls.trailing_zeros() as usize;
                sls &= sls - 1;
                let mut cur = idx.heads[fl][sl];
                while cur != NIL {
                    spans.push(cur);
                    cur = self.nodes[cur as usize].next_free;
                }
            }
        }
    }

    /// A freshly recorded epoch on stream tag `t` (used when promoting its free spans).
    pub(super) fn epoch_for_fresh(&mut self, clock: &dyn StreamClock, t: u8) -> EventId {
        let k = t as usize - 1;
        let e = clock.record(self.streams[k]);
        self.last_epoch[k] = Some(e);
        self.dirty[k] = false;
        e
    }
}
