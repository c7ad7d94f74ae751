//! The plan-time cost check of a fused CPU segment.
//!
//! A fused plan and the thunks it replaces do the same arithmetic; they
//! differ in memory traffic and dispatches:
//!
//! - every row chunk of a fused plan streams every weight of the segment
//!   (its GEMMs run per chunk), so weights are read once per chunk, where
//!   the thunks read each weight once;
//! - the thunks write every intermediate tensor to the arena and read it
//!   back, where the fused plan keeps a chunk's intermediates in cache;
//! - the thunks pay one fork/join per op, the fused plan one per segment.
//!
//! The model counts those bytes. A weight streamed again while it still
//! fits in half the last-level cache is read from that cache, which is
//! counted at a quarter of the cost of a memory read. The default chunking
//! (chosen for parallel efficiency) is kept when it moves no more bytes
//! than the thunks; otherwise the fewest chunks are tried; when those also
//! move more, the segment is declined and the hybrid runs its ops as
//! thunks.
//! (Measured case: a 100 MB projection in 32-row chunks on 16 threads ran
//! at 0.69x the thunks' speed; see `bench/results/recurrent_cpu.md`.)

use std::sync::OnceLock;

/// Bytes of memory traffic one fork/join is worth (about 3 µs at 20 GB/s).
const DISPATCH_BYTES: f64 = 64.0 * 1024.0;

/// Re-reading a weight that fits in half the last-level cache costs this
/// fraction of a memory read.
const CACHED_REREAD: f64 = 0.25;

/// What the cost model needs to know about a lowered segment.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SegmentTraffic {
    /// Rows the segment runs over.
    pub rows: usize,
    /// Bytes of every weight its matmuls read (f32).
    pub weight_bytes: usize,
    /// Bytes per row of the intermediates: values one op of the segment
    /// writes and another reads, which thunks round-trip through the arena.
    pub intermediate_row_bytes: usize,
    /// Ops in the segment (thunk dispatches it replaces).
    pub ops: usize,
}

/// The chosen chunking and the model's figures, for `rlx plan`.
#[derive(Debug, Clone)]
pub(crate) struct Choice {
    /// Rows per chunk.
    pub chunk_rows: usize,
    /// One line: the modelled bytes of the fused plan and of the thunks.
    pub note: String,
}

/// The last-level cache of this machine in bytes (Linux sysfs; 32 MiB if
/// it cannot be read).
pub(crate) fn llc_bytes() -> usize {
    static LLC: OnceLock<usize> = OnceLock::new();
    *LLC.get_or_init(|| read_llc().unwrap_or(32 << 20))
}

fn read_llc() -> Option<usize> {
    let mut best = None;
    for i in 0..8 {
        let dir = format!("/sys/devices/system/cpu/cpu0/cache/index{i}");
        let Ok(level) = std::fs::read_to_string(format!("{dir}/level")) else {
            continue;
        };
        let size = std::fs::read_to_string(format!("{dir}/size")).ok()?;
        let size = size.trim();
        let bytes = if let Some(k) = size.strip_suffix('K') {
            k.parse::<usize>().ok()? << 10
        } else if let Some(m) = size.strip_suffix('M') {
            m.parse::<usize>().ok()? << 20
        } else {
            size.parse::<usize>().ok()?
        };
        let level: usize = level.trim().parse().ok()?;
        if best.is_none_or(|(l, _)| level > l) {
            best = Some((level, bytes));
        }
    }
    best.map(|(_, b)| b)
}

fn mb(b: f64) -> String {
    format!("{:.1} MB", b / 1e6)
}

impl SegmentTraffic {
    /// Modelled bytes the fused plan moves beyond what thunks also move,
    /// with `chunks` row chunks.
    fn fused_extra(&self, chunks: usize, llc: usize) -> f64 {
        let w = self.weight_bytes as f64;
        let reread = if self.weight_bytes * 2 <= llc {
            CACHED_REREAD
        } else {
            1.0
        };
        w * reread * chunks.saturating_sub(1) as f64
    }

    /// Modelled bytes the thunks move beyond what the fused plan also moves.
    fn thunks_extra(&self) -> f64 {
        2.0 * (self.rows * self.intermediate_row_bytes) as f64
            + DISPATCH_BYTES * self.ops.saturating_sub(1) as f64
    }

    /// Pick the chunking: `default_rows` per chunk when that moves no more
    /// bytes than the thunks, else the fewest chunks (`max_rows` per chunk)
    /// when those do; `Err` with the figures when neither does. A single
    /// chunk is never declined (it streams each weight once, like thunks).
    pub(crate) fn choose(
        &self,
        default_rows: usize,
        max_rows: usize,
        llc: usize,
    ) -> Result<Choice, String> {
        let rows = self.rows.max(1);
        let thunks = self.thunks_extra();
        let figures = |cr: usize| {
            let chunks = rows.div_ceil(cr);
            let fused = self.fused_extra(chunks, llc);
            let line = format!(
                "weights {} streamed by {chunks} chunk(s): fused moves {} more, thunks {} more \
                 (intermediates {} B/row, {} dispatches)",
                mb(self.weight_bytes as f64),
                mb(fused),
                mb(thunks),
                self.intermediate_row_bytes,
                self.ops
            );
            (chunks == 1 || fused <= thunks, line)
        };
        let default_rows = default_rows.clamp(1, rows);
        let (ok, line) = figures(default_rows);
        if ok {
            return Ok(Choice {
                chunk_rows: default_rows,
                note: line,
            });
        }
        let fewest = max_rows.max(default_rows).min(rows);
        let (ok, fewest_line) = figures(fewest);
        if ok {
            return Ok(Choice {
                chunk_rows: fewest,
                note: format!("{fewest_line}; the default {line}"),
            });
        }
        Err(format!(
            "cost check: fused would move more memory than thunks ({fewest_line})"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LLC: usize = 32 << 20;

    #[test]
    fn one_chunk_is_never_declined() {
        let t = SegmentTraffic {
            rows: 128,
            weight_bytes: 400 << 20,
            intermediate_row_bytes: 0,
            ops: 1,
        };
        let c = t.choose(128, 512, LLC).unwrap();
        assert_eq!(c.chunk_rows, 128);
    }

    #[test]
    fn a_large_weight_streamed_per_chunk_picks_the_fewest_chunks() {
        // The GDN projection: 100 MB of weights, 512 rows, 12288 floats of
        // intermediates per row.
        let t = SegmentTraffic {
            rows: 512,
            weight_bytes: 100 << 20,
            intermediate_row_bytes: 12288 * 4,
            ops: 4,
        };
        let c = t.choose(32, 512, LLC).unwrap();
        assert_eq!(c.chunk_rows, 512, "{}", c.note);
        let c = t.choose(256, 512, LLC).unwrap();
        assert_eq!(c.chunk_rows, 512, "{}", c.note);
    }

    #[test]
    fn many_chunks_over_an_uncached_weight_are_declined() {
        let t = SegmentTraffic {
            rows: 4096,
            weight_bytes: 100 << 20,
            intermediate_row_bytes: 64,
            ops: 2,
        };
        let e = t.choose(256, 512, LLC).unwrap_err();
        assert!(e.contains("cost check") && e.contains("8 chunk(s)"), "{e}");
    }

    #[test]
    fn cached_weights_keep_the_default_chunking() {
        // MiniLM's FFN at 32x128 on 16 threads: 4.7 MB of weights, the
        // 1536-wide intermediate.
        let t = SegmentTraffic {
            rows: 4096,
            weight_bytes: 2 * 384 * 1536 * 4,
            intermediate_row_bytes: 1536 * 4,
            ops: 4,
        };
        let c = t.choose(256, 512, LLC).unwrap();
        assert_eq!(c.chunk_rows, 256, "{}", c.note);
        // The same weights with a 4 MiB cache: 15 more streams of 4.7 MB
        // (70.8 MB) exceed the 50.3 MB of intermediates; 8 chunks (33 MB)
        // do not.
        let c = t.choose(256, 512, 4 << 20).unwrap();
        assert_eq!(c.chunk_rows, 512, "{}", c.note);
    }
}
