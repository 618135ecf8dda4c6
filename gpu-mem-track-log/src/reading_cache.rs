//! The rule for reading a device figure again: NVML's per-process memory and the driver's free
//! memory (`cudaMemGetInfo`) each cost a call into the driver, which a `track!()` per step of a
//! launch-bound CUDA loop would pay on its own thread. Both move with the caching allocator's
//! reserved memory (PyTorch's `cudaMalloc`/`cudaFree`), which stays put in a steady training
//! loop; what moves them otherwise (library handles, other processes on the device) shows within
//! `max_age`.
use std::time::{Duration, Instant};

/// The last reading of a figure, read again only when it can have changed: when the caching
/// allocator's reserved memory moved since, or after `max_age`.
#[derive(Debug, Clone)]
pub struct ReadingCache<T> {
    max_age: Duration,
    last: Option<(T, Option<u64>, Instant)>,
}

impl<T: Copy> ReadingCache<T> {
    /// An empty cache whose readings are kept at most `max_age`.
    pub fn new(max_age: Duration) -> Self {
        ReadingCache { max_age, last: None }
    }

    /// The reading for `reserved` (the caching allocator's reserved bytes now, `None` when not
    /// known: then every call reads) at `now`: the last one when still valid, else `read()`'s.
    ///
    /// # Errors
    /// `read`'s error; the cache is then left as it was.
    pub fn get<E>(
        &mut self,
        reserved: Option<u64>,
        now: Instant,
        read: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        if let Some((reading, at_reserved, at)) = self.last {
            let fresh = now.checked_duration_since(at).is_some_and(|age| age < self.max_age);
            if reserved.is_some() && at_reserved == reserved && fresh {
                return Ok(reading);
            }
        }
        let reading = read()?;
        self.last = Some((reading, reserved, now));
        Ok(reading)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reading_is_reused_until_reserved_memory_moves_or_it_ages() {
        let mut cache = ReadingCache::new(Duration::from_secs(1));
        let reads = std::cell::Cell::new(0u64);
        let read = || -> Result<u64, String> {
            reads.set(reads.get() + 1);
            Ok(reads.get())
        };
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        assert_eq!(cache.get(Some(100), ms(0), read), Ok(1));
        assert_eq!(cache.get(Some(100), ms(10), read), Ok(1), "reserved unchanged: reused");
        assert_eq!(cache.get(Some(200), ms(20), read), Ok(2), "reserved moved");
        assert_eq!(cache.get(Some(200), ms(1100), read), Ok(3), "older than a second");
        assert_eq!(cache.get(None, ms(1101), read), Ok(4), "reserved unknown: always read");
        assert_eq!(cache.get(None, ms(1102), read), Ok(5));
        let failing = || Err("gone".to_string());
        assert!(cache.get(Some(300), ms(1103), failing).is_err());
        assert_eq!(cache.get(None, ms(1104), read), Ok(6), "an error keeps nothing");
        assert_eq!(reads.get(), 6);
    }
}
