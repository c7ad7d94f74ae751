//! Shared helpers for the integration tests.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// Writes `bytes` to a fresh file under the cargo test tmp dir.
pub fn tmp_file(stem: &str, bytes: &[u8]) -> PathBuf {
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("rlx-formats-{}-{n}-{stem}", std::process::id()));
    std::fs::write(&path, bytes).expect("write tmp file");
    path
}
