//! KV-cache kernels: `CacheWrite` in place, and attention for a few query
//! rows (decode) that reads the valid KV length from device memory.
//!
//! - `cache_write`: rows `pos..pos + n` of a cache param are overwritten in
//!   place; `pos` is read from device memory, so the launch is the same at
//!   every step. A position outside the cache records `-(node + 1)` in the
//!   status word and writes nothing.
//! - `attention_rows` (head_dim <= 128) and `attention_rows_d256` (<= 256):
//!   one block per (query row, head, batch); keys in
//!   tiles of 256, one per thread for the scores and one per warp for P.V,
//!   online softmax across tiles. The valid KV length comes from device
//!   memory: a `kv_len` i32 per batch row when given, and the last kept key
//!   of a keep-mask, found by the block itself (the decode mask marks the
//!   filled cache positions). A decode step over a preallocated cache
//!   therefore costs the valid length, not the context, and no launch
//!   depends on a host-side length: the step can be captured in one CUDA
//!   graph and replayed at every position.

use crate::launch::{Arg, Launch};

/// Names of every kernel in `cu/kv.cu`.
pub(crate) const KERNELS: &[&str] = &[
    "cache_write",
    "rope_cache_row",
    "attention_rows",
    "attention_rows_d256",
];

/// Query rows up to which attention uses `attention_rows`.
pub(crate) const ROWS_MAX_SQ: usize = 4;

/// Where a `CacheWrite` reads and writes.
pub(crate) struct CacheWrite {
    /// The cache `[b, ctx, d]` (written in place).
    pub cache: u64,
    /// The new rows `[b, n, d]`.
    pub rows: u64,
    /// The start position, one integer in device memory.
    pub pos: u64,
    /// Whether the position is i64 (else i32).
    pub pos64: bool,
    /// Cache dims.
    pub b: usize,
    pub ctx: usize,
    pub n: usize,
    pub d: usize,
    /// The node id, recorded in the status word on a bad position.
    pub node: u32,
}

/// Lower a `CacheWrite`.
pub(crate) fn cache_write(c: &CacheWrite) -> Result<Vec<Launch>, String> {
    let int = |v: usize, what: &str| {
        i32::try_from(v).map_err(|_| format!("{what} = {v} does not fit a 32-bit int"))
    };
    let total = c.b * c.n * c.d;
    if total == 0 {
        return Ok(vec![]);
    }
    int(c.b * c.ctx * c.d, "cache elements")?;
    Ok(vec![Launch::Kernel {
        name: "cache_write",
        grid: [total.div_ceil(256).clamp(1, 8192) as u32, 1, 1],
        block: 256,
        smem: 0,
        args: vec![
            Arg::P(c.cache),
            Arg::P(c.rows),
            Arg::P(c.pos),
            Arg::I(c.pos64 as i32),
            Arg::I(int(c.b, "batch")?),
            Arg::I(int(c.ctx, "ctx")?),
            Arg::I(int(c.n, "rows")?),
            Arg::I(int(c.d, "width")?),
            Arg::Status,
            Arg::I(c.node as i32),
        ],
    }])
}
