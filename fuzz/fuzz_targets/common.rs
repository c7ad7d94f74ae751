//! Scratch files for targets whose readers take a path (they memory-map).

#![allow(dead_code)]

use std::path::PathBuf;

/// A path unique to this process and `name`, in memory (`/dev/shm`) where
/// that exists, else under the temp dir.
pub fn scratch(name: &str) -> PathBuf {
    let shm = std::path::Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    dir.join(format!("rlx-fuzz-{}-{name}", std::process::id()))
}

/// Writes `bytes` to the scratch file `name` (replacing it) and returns its path.
pub fn write_scratch(name: &str, bytes: &[u8]) -> PathBuf {
    let path = scratch(name);
    std::fs::write(&path, bytes).expect("write scratch file");
    path
}

/// A fresh, empty scratch directory `name`.
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = scratch(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}
