//! Shared helpers for the integration tests.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// Writes `bytes` to a fresh file under the cargo test tmp dir.
///
/// With `RLX_FUZZ_SEED_DIR` set, every file is also saved there (named by
/// its stem and a hash of its bytes): `fuzz/make_seeds.sh` collects the
/// hand-built valid and corrupt files as fuzz seeds this way.
pub fn tmp_file(stem: &str, bytes: &[u8]) -> PathBuf {
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    if let Some(dir) = std::env::var_os("RLX_FUZZ_SEED_DIR") {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        bytes.hash(&mut h);
        let seed = PathBuf::from(dir).join(format!("{:016x}-{stem}", h.finish()));
        std::fs::write(seed, bytes).expect("write fuzz seed");
    }
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("rlx-formats-{}-{n}-{stem}", std::process::id()));
    std::fs::write(&path, bytes).expect("write tmp file");
    path
}
