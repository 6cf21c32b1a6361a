//! The prefetch buffer: batches of IDs with the moment each was asked for. An ID is handed out
//! only while its batch is younger than the validity window; older batches are discarded whole,
//! so prefetching never makes an ID older than the window.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

struct Batch {
    /// When the request that brought the batch was sent: every ID in it was made after.
    asked_at: Instant,
    ids: VecDeque<u64>,
}

#[derive(Default)]
pub(crate) struct Buffer {
    batches: VecDeque<Batch>,
    len: usize,
}

impl Buffer {
    /// IDs held, stale ones included until the next [`Self::take`] drops them.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn push(&mut self, asked_at: Instant, ids: Vec<u64>) {
        self.len += ids.len();
        self.batches.push_back(Batch { asked_at, ids: ids.into() });
    }

    /// The next ID asked for less than `validity` before `now`, and how many stale IDs were
    /// dropped on the way.
    pub fn take(&mut self, now: Instant, validity: Duration) -> (Option<u64>, usize) {
        let mut dropped = 0;
        while let Some(batch) = self.batches.front_mut() {
            if now.saturating_duration_since(batch.asked_at) >= validity {
                dropped += batch.ids.len();
                self.len -= batch.ids.len();
                self.batches.pop_front();
                continue;
            }
            match batch.ids.pop_front() {
                Some(id) => {
                    self.len -= 1;
                    return (Some(id), dropped);
                }
                None => {
                    self.batches.pop_front();
                }
            }
        }
        (None, dropped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_come_out_in_order_until_their_batch_is_older_than_the_window() {
        let start = Instant::now();
        let window = Duration::from_secs(2);
        let mut buffer = Buffer::default();
        buffer.push(start, vec![1, 2, 3]);
        buffer.push(start + Duration::from_millis(1_500), vec![10, 11]);
        assert_eq!(buffer.take(start, window), (Some(1), 0));
        assert_eq!(buffer.take(start + Duration::from_millis(1_999), window), (Some(2), 0));
        // The first batch is 2 s old: its last ID is dropped, the second batch serves.
        assert_eq!(buffer.take(start + window, window), (Some(10), 1));
        assert_eq!(buffer.len(), 1);
        assert_eq!(buffer.take(start + Duration::from_secs(4), window), (None, 1), "all stale");
        assert_eq!(buffer.len(), 0);
        assert_eq!(buffer.take(start + Duration::from_secs(4), window), (None, 0));
    }
}
