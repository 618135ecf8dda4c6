//! A model of PyTorch's CUDA caching allocator (`c10/cuda/CUDACachingAllocator.cpp`), to turn an
//! allocation/free sequence recorded on the meta device into the `memory_allocated` and
//! `memory_reserved` a GPU would show.
//!
//! Modelled: sizes rounded up to 512 bytes; requests up to 1 MiB served from a small pool of 2 MiB
//! segments, larger ones from a large pool (20 MiB segments below 10 MiB, else the size rounded up to
//! 2 MiB); best-fit reuse of cached free blocks (smallest block that fits, then lowest address);
//! splitting a block when the remainder is at least 512 bytes (small pool) or more than 1 MiB (large
//! pool) - an unsplit block counts whole in `allocated`; merging a freed block with free neighbours
//! of its segment; segments released only by `empty_cache` or when a capacity is set and a
//! new segment would not fit (then every fully free segment is released and the request retried).
//! Not modelled: streams (one stream), `expandable_segments`, `max_split_size_mb` and
//! `roundup_power2_divisions` (their defaults are off), and the CUDA context itself.
use std::collections::BTreeSet;

/// Allocation granularity.
pub const MIN_BLOCK_SIZE: u64 = 512;
/// Largest request served by the small pool.
pub const SMALL_SIZE: u64 = 1 << 20;
/// Segment size of the small pool.
pub const SMALL_BUFFER: u64 = 2 << 20;
/// Segment size for large-pool requests below [`MIN_LARGE_ALLOC`].
pub const LARGE_BUFFER: u64 = 20 << 20;
/// From this size on, a request gets its own segment rounded to [`ROUND_LARGE`].
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
/// Rounding of large segments.
pub const ROUND_LARGE: u64 = 2 << 20;

/// Rounds a request to the allocator's granularity.
pub fn round_size(size: u64) -> u64 {
    if size < MIN_BLOCK_SIZE {
        MIN_BLOCK_SIZE
    } else {
        size.div_ceil(MIN_BLOCK_SIZE).saturating_mul(MIN_BLOCK_SIZE)
    }
}

/// Size of the segment `cudaMalloc`ed for a (rounded) request that no cached block can serve.
pub fn segment_size(rounded: u64) -> u64 {
    if rounded <= SMALL_SIZE {
        SMALL_BUFFER
    } else if rounded < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        rounded.div_ceil(ROUND_LARGE).saturating_mul(ROUND_LARGE)
    }
}

/// Handle of an allocated block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId(usize);

#[derive(Debug, Clone)]
struct Block {
    segment: usize,
    addr: u64,
    size: u64,
    requested: u64,
    allocated: bool,
    prev: Option<usize>,
    next: Option<usize>,
    live: bool, // false once merged away
}

#[derive(Debug, Clone)]
struct Segment {
    addr: u64,
    size: u64,
    small: bool,
    released: bool,
}

/// Counters of the model, as `torch.cuda.memory_stats()` names them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CachingStats {
    /// Bytes in allocated blocks (rounded, unsplit remainders included).
    pub allocated: u64,
    /// Bytes in segments held from the device.
    pub reserved: u64,
    /// Bytes requested by the caller (before rounding).
    pub requested: u64,
    /// Highest `allocated`.
    pub peak_allocated: u64,
    /// Highest `reserved`.
    pub peak_reserved: u64,
    /// Segments allocated (`cudaMalloc` calls).
    pub segment_allocs: u64,
    /// Segments released (`cudaFree` calls).
    pub segment_frees: u64,
}

/// A live segment and its blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentBlocks {
    /// Segment address.
    pub address: u64,
    /// Segment size.
    pub size: u64,
    /// Small pool.
    pub small: bool,
    /// Its blocks, in address order.
    pub blocks: Vec<BlockLayout>,
}

/// One block of a live segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct BlockLayout {
    /// Block address.
    pub address: u64,
    /// Block size (rounded, an unsplit remainder included).
    pub size: u64,
    /// Bytes its allocation asked for (0 when free).
    pub requested: u64,
    /// Allocated (else cached free).
    pub allocated: bool,
}

/// The request could not be served within the capacity, even after the retry PyTorch makes
/// (`release_cached_blocks`: every fully free segment released, then `cudaMalloc` again): what a
/// GPU would answer with `torch.OutOfMemoryError`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, thiserror::Error)]
#[error(
    "out of memory: {rounded} bytes asked for (a new {segment}-byte segment) with {reserved} of {capacity} \
     bytes reserved after releasing the cache: {} bytes short",
    self.short_by()
)]
pub struct OutOfMemory {
    /// Bytes the caller asked for.
    pub requested: u64,
    /// The request rounded to the allocator's granularity ([`round_size`]).
    pub rounded: u64,
    /// The segment the allocator had to `cudaMalloc` for it ([`segment_size`]): no cached free
    /// block could serve it.
    pub segment: u64,
    /// Reserved after the cache was released: segments holding live blocks.
    pub reserved: u64,
    /// Allocated at the time (live blocks).
    pub allocated: u64,
    /// The capacity given to the model.
    pub capacity: u64,
}

impl OutOfMemory {
    /// Bytes missing for the request to succeed: the segment it needs minus what the capacity
    /// leaves beside the segments still reserved (`segment + reserved - capacity`, always > 0).
    /// Free space inside reserved segments (fragmentation) cannot serve it and counts as taken.
    pub fn short_by(&self) -> u64 {
        self.segment.saturating_add(self.reserved).saturating_sub(self.capacity)
    }
}

/// The model. See the module docs for what it covers.
#[derive(Debug, Clone, Default)]
pub struct CachingAllocatorModel {
    blocks: Vec<Block>,
    segments: Vec<Segment>,
    // Free blocks per pool, ordered like PyTorch's BlockComparator: (size, address).
    free_small: BTreeSet<(u64, u64, usize)>,
    free_large: BTreeSet<(u64, u64, usize)>,
    next_addr: u64,
    capacity: Option<u64>,
    stats: CachingStats,
}

impl CachingAllocatorModel {
    /// A model with unlimited device memory.
    pub fn new() -> Self {
        CachingAllocatorModel { next_addr: 1 << 32, ..Default::default() }
    }

    /// A model of a device with `bytes` of memory available to the allocator.
    pub fn with_capacity(bytes: u64) -> Self {
        CachingAllocatorModel { capacity: Some(bytes), ..Self::new() }
    }

    /// The counters now.
    pub fn stats(&self) -> CachingStats {
        self.stats
    }

    /// Address and size of a live block (for snapshots).
    pub fn block(&self, id: BlockId) -> Option<(u64, u64)> {
        self.blocks.get(id.0).filter(|b| b.allocated).map(|b| (b.addr, b.size))
    }

    fn pool(&mut self, small: bool) -> &mut BTreeSet<(u64, u64, usize)> {
        if small {
            &mut self.free_small
        } else {
            &mut self.free_large
        }
    }

    fn insert_free(&mut self, i: usize) {
        let (size, addr, small) =
            (self.blocks[i].size, self.blocks[i].addr, self.segments[self.blocks[i].segment].small);
        self.pool(small).insert((size, addr, i));
    }

    fn remove_free(&mut self, i: usize) {
        let (size, addr, small) =
            (self.blocks[i].size, self.blocks[i].addr, self.segments[self.blocks[i].segment].small);
        self.pool(small).remove(&(size, addr, i));
    }

    /// A new segment of `size` bytes; `None` when a capacity is set and it does not fit even
    /// after every fully free segment was released (PyTorch's retry in `malloc`).
    fn new_segment(&mut self, size: u64, small: bool) -> Option<usize> {
        if let Some(cap) = self.capacity {
            if self.stats.reserved.saturating_add(size) > cap {
                self.empty_cache();
                if self.stats.reserved.saturating_add(size) > cap {
                    return None;
                }
            }
        }
        let seg = self.segments.len();
        let addr = self.next_addr;
        // Saturating: absurd sizes (a corrupt trace) must not wrap addresses or totals.
        self.next_addr =
            self.next_addr.saturating_add(size.div_ceil(ROUND_LARGE).saturating_mul(ROUND_LARGE));
        self.segments.push(Segment { addr, size, small, released: false });
        self.blocks.push(Block {
            segment: seg,
            addr,
            size,
            requested: 0,
            allocated: false,
            prev: None,
            next: None,
            live: true,
        });
        self.stats.reserved = self.stats.reserved.saturating_add(size);
        self.stats.peak_reserved = self.stats.peak_reserved.max(self.stats.reserved);
        self.stats.segment_allocs += 1;
        Some(self.blocks.len() - 1)
    }

    /// Allocates `size` bytes.
    ///
    /// # Errors
    /// [`OutOfMemory`] when a capacity is set and the request cannot fit even after releasing
    /// the cache; the model is then as the retry left it (cache released, nothing allocated).
    pub fn malloc(&mut self, size: u64) -> Result<BlockId, OutOfMemory> {
        // PyTorch returns a null pointer for 0 bytes and takes no block
        // (`NativeCachingAllocator::allocate`); freeing it is a no-op.
        if size == 0 {
            return Ok(BlockId(usize::MAX));
        }
        let rounded = round_size(size);
        let small = rounded <= SMALL_SIZE;
        let found = self.pool(small).range((rounded, 0, 0)..).next().copied();
        let i = match found {
            Some((_, _, i)) => {
                self.remove_free(i);
                i
            }
            None => {
                let segment = segment_size(rounded);
                match self.new_segment(segment, small) {
                    Some(i) => i,
                    // Read after the retry: what was left reserved once the cache was released.
                    None => {
                        return Err(OutOfMemory {
                            requested: size,
                            rounded,
                            segment,
                            reserved: self.stats.reserved,
                            allocated: self.stats.allocated,
                            capacity: self.capacity.unwrap_or(u64::MAX),
                        })
                    }
                }
            }
        };
        let remaining = self.blocks[i].size - rounded;
        let split = if small { remaining >= MIN_BLOCK_SIZE } else { remaining > SMALL_SIZE };
        if split {
            let b = &self.blocks[i];
            let rest = Block {
                segment: b.segment,
                addr: b.addr + rounded,
                size: remaining,
                requested: 0,
                allocated: false,
                prev: Some(i),
                next: b.next,
                live: true,
            };
            self.blocks.push(rest);
            let r = self.blocks.len() - 1;
            if let Some(n) = self.blocks[i].next {
                self.blocks[n].prev = Some(r);
            }
            self.blocks[i].next = Some(r);
            self.blocks[i].size = rounded;
            self.insert_free(r);
        }
        let b = &mut self.blocks[i];
        b.allocated = true;
        b.requested = size;
        self.stats.allocated = self.stats.allocated.saturating_add(b.size);
        self.stats.requested = self.stats.requested.saturating_add(size);
        self.stats.peak_allocated = self.stats.peak_allocated.max(self.stats.allocated);
        Ok(BlockId(i))
    }

    /// Frees a block: it returns to the cache, merged with free neighbours.
    pub fn free(&mut self, id: BlockId) {
        let i = id.0;
        if !self.blocks.get(i).is_some_and(|b| b.allocated && b.live) {
            return;
        }
        self.blocks[i].allocated = false;
        self.stats.allocated = self.stats.allocated.saturating_sub(self.blocks[i].size);
        self.stats.requested = self.stats.requested.saturating_sub(self.blocks[i].requested);
        // Merge with the previous and next blocks of the segment when they are free.
        let mut cur = i;
        if let Some(p) = self.blocks[cur].prev.filter(|&p| !self.blocks[p].allocated) {
            self.remove_free(p);
            self.absorb(p, cur);
            cur = p;
        }
        if let Some(n) = self.blocks[cur].next.filter(|&n| !self.blocks[n].allocated) {
            self.remove_free(n);
            self.absorb(cur, n);
        }
        self.insert_free(cur);
    }

    /// `first` takes over its successor `second`.
    fn absorb(&mut self, first: usize, second: usize) {
        let (size, next) = (self.blocks[second].size, self.blocks[second].next);
        self.blocks[first].size += size;
        self.blocks[first].next = next;
        if let Some(n) = next {
            self.blocks[n].prev = Some(first);
        }
        self.blocks[second].live = false;
    }

    /// Releases every segment whose memory is entirely free (`torch.cuda.empty_cache()`).
    pub fn empty_cache(&mut self) {
        for pool_small in [true, false] {
            let pool = if pool_small { &self.free_small } else { &self.free_large };
            let whole: Vec<(u64, u64, usize)> = pool
                .iter()
                .filter(|&&(size, _, i)| size == self.segments[self.blocks[i].segment].size)
                .copied()
                .collect();
            for entry in whole {
                self.pool(pool_small).remove(&entry);
                let seg = self.blocks[entry.2].segment;
                self.blocks[entry.2].live = false;
                self.segments[seg].released = true;
                self.stats.reserved = self.stats.reserved.saturating_sub(self.segments[seg].size);
                self.stats.segment_frees += 1;
            }
        }
    }

    /// Live segments as (address, size, small pool).
    pub fn segments(&self) -> Vec<(u64, u64, bool)> {
        self.segments.iter().filter(|s| !s.released).map(|s| (s.addr, s.size, s.small)).collect()
    }

    /// Each live segment with its blocks in address order.
    pub fn segment_blocks(&self) -> Vec<SegmentBlocks> {
        let mut out = Vec::new();
        for (si, seg) in self.segments.iter().enumerate().filter(|(_, s)| !s.released) {
            let mut blocks: Vec<BlockLayout> = self
                .blocks
                .iter()
                .filter(|b| b.live && b.segment == si)
                .map(|b| BlockLayout {
                    address: b.addr,
                    size: b.size,
                    requested: if b.allocated { b.requested } else { 0 },
                    allocated: b.allocated,
                })
                .collect();
            blocks.sort_unstable();
            out.push(SegmentBlocks { address: seg.addr, size: seg.size, small: seg.small, blocks });
        }
        out
    }
}

#[cfg(test)]
mod zero_byte_tests {
    use super::*;

    #[test]
    fn absurd_sizes_saturate_instead_of_wrapping() {
        let mut m = CachingAllocatorModel::new();
        for _ in 0..4 {
            m.malloc(1 << 62).unwrap();
        }
        m.malloc(u64::MAX).unwrap();
        assert_eq!(m.stats().allocated, u64::MAX, "four 2^62 blocks: not wrapped to 0");
        assert_eq!(m.stats().peak_reserved, u64::MAX);
    }

    #[test]
    fn zero_bytes_take_no_block() {
        let mut m = CachingAllocatorModel::new();
        let z = m.malloc(0).unwrap();
        assert_eq!(m.stats(), CachingStats::default(), "nothing allocated or reserved");
        assert_eq!(m.block(z), None);
        m.free(z);
        let b = m.malloc(1).unwrap();
        assert_eq!(m.stats().allocated, MIN_BLOCK_SIZE);
        m.free(b);
        assert_eq!(m.stats().allocated, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn requests_are_rounded_to_512_bytes_and_small_ones_share_a_2_mib_segment() {
        let mut m = CachingAllocatorModel::new();
        m.malloc(1).unwrap();
        assert_eq!((m.stats().allocated, m.stats().reserved), (512, 2 * MIB));
        m.malloc(1000).unwrap(); // -> 1024, split from the same segment
        m.malloc(513).unwrap(); // -> 1024
        let s = m.stats();
        assert_eq!((s.allocated, s.reserved, s.requested, s.segment_allocs), (2560, 2 * MIB, 1514, 1));
    }

    #[test]
    fn mid_sized_requests_get_a_20_mib_segment_and_share_it() {
        let mut m = CachingAllocatorModel::new();
        let a = m.malloc(5 * MIB).unwrap();
        m.malloc(5 * MIB).unwrap();
        assert_eq!((m.stats().allocated, m.stats().reserved), (10 * MIB, 20 * MIB));
        m.free(a);
        assert_eq!(
            (m.stats().allocated, m.stats().reserved),
            (5 * MIB, 20 * MIB),
            "freed memory stays cached"
        );
    }

    #[test]
    fn large_requests_round_to_2_mib_and_small_remainders_are_not_split() {
        let mut m = CachingAllocatorModel::new();
        m.malloc(11 * MIB).unwrap(); // segment 12 MiB; 1 MiB left is not > 1 MiB: no split
        let s = m.stats();
        assert_eq!((s.allocated, s.reserved), (12 * MIB, 12 * MIB));
        let mut m = CachingAllocatorModel::new();
        m.malloc(11 * MIB + 100).unwrap(); // rounded up to 11 MiB + 512, segment 12 MiB, no split
        assert_eq!(m.stats().allocated, 12 * MIB);
    }

    #[test]
    fn a_freed_large_block_serves_a_smaller_request_by_splitting() {
        let mut m = CachingAllocatorModel::new();
        let a = m.malloc(12 * MIB).unwrap();
        m.free(a);
        let b = m.malloc(4 * MIB).unwrap();
        let s = m.stats();
        assert_eq!((s.allocated, s.reserved, s.segment_allocs), (4 * MIB, 12 * MIB, 1));
        // The 8 MiB remainder serves the next request too.
        let c = m.malloc(8 * MIB).unwrap();
        assert_eq!((m.stats().reserved, m.stats().segment_allocs), (12 * MIB, 1));
        let (addr_b, _) = m.block(b).unwrap();
        let (addr_c, _) = m.block(c).unwrap();
        assert_eq!(addr_c, addr_b + 4 * MIB);
    }

    #[test]
    fn best_fit_picks_the_smallest_free_block_that_fits() {
        let mut m = CachingAllocatorModel::new();
        let big = m.malloc(30 * MIB).unwrap();
        let mid = m.malloc(14 * MIB).unwrap();
        m.free(big);
        m.free(mid);
        let x = m.malloc(13 * MIB).unwrap();
        assert_eq!(m.block(x).unwrap().1, 14 * MIB, "the 14 MiB block, unsplit (1 MiB left)");
        assert_eq!(m.stats().allocated, 14 * MIB);
    }

    #[test]
    fn neighbours_merge_on_free_so_a_segment_is_reused_whole() {
        let mut m = CachingAllocatorModel::new();
        let a = m.malloc(6 * MIB).unwrap();
        let b = m.malloc(6 * MIB).unwrap();
        let c = m.malloc(6 * MIB).unwrap();
        assert_eq!(m.stats().reserved, 20 * MIB);
        m.free(a);
        m.free(c);
        m.free(b); // merges with both neighbours: one free 20 MiB block
        m.malloc(19 * MIB).unwrap();
        assert_eq!((m.stats().reserved, m.stats().segment_allocs), (20 * MIB, 1));
    }

    #[test]
    fn small_and_large_pools_do_not_mix() {
        let mut m = CachingAllocatorModel::new();
        let a = m.malloc(5 * MIB).unwrap();
        m.free(a);
        m.malloc(1000).unwrap();
        assert_eq!((m.stats().reserved, m.stats().segment_allocs), (22 * MIB, 2));
    }

    #[test]
    fn the_third_allocation_that_cannot_fit_is_named_with_its_shortfall() {
        let mut m = CachingAllocatorModel::with_capacity(50 * MIB);
        m.malloc(12 * MIB).unwrap();
        m.malloc(20 * MIB).unwrap();
        // 30 MiB + 1 byte: rounded to 30 MiB + 512, a 32 MiB segment; 32 + 32 > 50.
        let e = m.malloc(30 * MIB + 1).unwrap_err();
        assert_eq!(
            e,
            OutOfMemory {
                requested: 30 * MIB + 1,
                rounded: 30 * MIB + 512,
                segment: 32 * MIB,
                reserved: 32 * MIB,
                allocated: 32 * MIB,
                capacity: 50 * MIB,
            }
        );
        assert_eq!(e.short_by(), 14 * MIB, "32 MiB segment + 32 MiB reserved - 50 MiB");
        assert!(e.to_string().contains("14680064 bytes short"), "{e}");
        // Nothing was taken: the model goes on as before the failed request.
        assert_eq!((m.stats().allocated, m.stats().reserved), (32 * MIB, 32 * MIB));
        m.malloc(18 * MIB).unwrap();
    }

    #[test]
    fn the_retry_releases_cached_segments_before_an_allocation_is_refused() {
        let mut m = CachingAllocatorModel::with_capacity(50 * MIB);
        let a = m.malloc(24 * MIB).unwrap();
        m.malloc(12 * MIB).unwrap();
        m.free(a); // cached: 36 MiB reserved, 12 MiB allocated
                   // No cached block holds 26 MiB; 36 + 26 > 50, but with the 24 MiB segment released it fits.
        m.malloc(26 * MIB).unwrap();
        let s = m.stats();
        assert_eq!((s.reserved, s.allocated, s.segment_frees), (38 * MIB, 38 * MIB, 1));
        let e = m.malloc(14 * MIB).unwrap_err();
        assert_eq!((e.reserved, e.short_by()), (38 * MIB, 2 * MIB));
    }

    #[test]
    fn free_space_inside_a_segment_in_use_is_not_released_and_counts_as_taken() {
        let mut m = CachingAllocatorModel::with_capacity(40 * MIB);
        let a = m.malloc(6 * MIB).unwrap();
        m.malloc(6 * MIB).unwrap(); // both in one 20 MiB segment
        m.free(a);
        let e = m.malloc(22 * MIB).unwrap_err();
        assert_eq!((e.reserved, e.allocated, e.short_by()), (20 * MIB, 6 * MIB, 2 * MIB));
        // A small request needs a whole 20 MiB segment: short by the segment, not the request.
        let mut m = CachingAllocatorModel::with_capacity(30 * MIB);
        m.malloc(12 * MIB).unwrap();
        let e = m.malloc(5 * MIB).unwrap_err();
        assert_eq!((e.rounded, e.segment, e.short_by()), (5 * MIB, 20 * MIB, 2 * MIB));
    }

    #[test]
    fn empty_cache_releases_only_free_segments_and_capacity_forces_it() {
        let mut m = CachingAllocatorModel::new();
        let a = m.malloc(12 * MIB).unwrap();
        m.malloc(16 * MIB).unwrap();
        m.free(a);
        m.empty_cache();
        let s = m.stats();
        assert_eq!((s.reserved, s.peak_reserved, s.segment_frees), (16 * MIB, 28 * MIB, 1));

        let mut m = CachingAllocatorModel::with_capacity(40 * MIB);
        let a = m.malloc(24 * MIB).unwrap();
        m.free(a); // cached, not released
        m.malloc(30 * MIB).unwrap(); // 24 + 30 > 40: the cache is released, then it fits
        assert_eq!(m.stats().reserved, 30 * MIB);
        let e = m.malloc(12 * MIB).unwrap_err();
        assert_eq!(e.capacity, 40 * MIB);
    }
}
