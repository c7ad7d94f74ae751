//! The bad-input table (`tests/bad_input.json`): the `rlx` binary on every
//! bad input of issue #21 and of the readers' hostile-file tests. Each row
//! must exit normally (no signal, no panic) with the expected exit code,
//! print an error naming what is wrong, and stay under its peak-RSS
//! (`VmHWM`, polled every 20 ms) and wall-time ceilings; the child is
//! killed past either.
//!
//! Rows that need the MiniLM directory or the SmolLM2 GGUF are skipped
//! (with a message) when those are not fetched (`scripts/fetch_models.py
//! all`). `RLX_BAD_INPUT=substring` runs only the rows whose name contains
//! it.

use serde::Deserialize;
use serde_json::{Map, Value};
use std::io::{Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Deserialize)]
struct Table {
    rows: Vec<Row>,
}

#[derive(Deserialize)]
struct Row {
    name: String,
    case: String,
    #[serde(default)]
    needs: Vec<String>,
    #[serde(default)]
    setup: Option<Setup>,
    args: Vec<String>,
    /// `nonzero` (default) or `any`.
    #[serde(default = "nonzero")]
    exit: String,
    /// Every group must match by one of its alternatives (case-insensitive).
    stderr: Vec<Vec<String>>,
    rss_mb: u64,
    wall_s: f64,
}

fn nonzero() -> String {
    "nonzero".into()
}

/// How a row makes its input. `kind` picks the builder; the other fields
/// are its parameters.
#[derive(Deserialize)]
struct Setup {
    kind: String,
    #[serde(default)]
    config: Map<String, Value>,
    #[serde(default)]
    st_config: Map<String, Value>,
    tensor: Option<String>,
    value: Option<String>,
    from: Option<String>,
    to: Option<String>,
    len: Option<usize>,
    file: Option<String>,
    text: Option<String>,
    hex: Option<String>,
    content: Option<String>,
    lines: Option<usize>,
    type_id: Option<u32>,
    rename: Option<String>,
    key: Option<String>,
    u32: Option<u32>,
}

fn table() -> Table {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/bad_input.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).expect("bad_input.json parses")
}

fn models_dir() -> PathBuf {
    match std::env::var_os("RLX_MODELS_DIR") {
        Some(d) => PathBuf::from(d),
        None => {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/rlx/models")
        }
    }
}

fn minilm() -> PathBuf {
    models_dir().join("all-minilm-l6-v2")
}

fn smollm2() -> PathBuf {
    models_dir().join("smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf")
}

fn available(what: &str) -> bool {
    match what {
        "minilm" => minilm().join("model.safetensors").is_file(),
        "smollm2" => smollm2().is_file(),
        other => panic!("unknown need {other:?}"),
    }
}

/// Paths a row's arguments refer to.
struct Paths {
    m: PathBuf,
    g: PathBuf,
    file: PathBuf,
    tmp: PathBuf,
}

impl Paths {
    fn fill(&self, s: &str) -> String {
        s.replace("{M}", &self.m.to_string_lossy())
            .replace("{G}", &self.g.to_string_lossy())
            .replace("{FILE}", &self.file.to_string_lossy())
            .replace("{TMP}", &self.tmp.to_string_lossy())
    }
}

/// A temp copy of the MiniLM dir: small files and the sentence-transformers
/// module folders (`1_Pooling/`, `2_Normalize/`) copied, the weights
/// symlinked (replaced by the caller where it changes them).
fn copy_minilm(to: &Path) {
    copy_dir(&minilm(), to);
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let (src, dst) = (e.path(), to.join(e.file_name()));
        if e.file_name() == "model.safetensors" {
            std::os::unix::fs::symlink(&src, &dst).unwrap();
        } else if src.is_file() {
            std::fs::copy(&src, &dst).unwrap();
        } else if src.is_dir() {
            copy_dir(&src, &dst);
        }
    }
}

fn merge_json(path: &Path, changes: &Map<String, Value>) {
    if changes.is_empty() {
        return;
    }
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    for (k, x) in changes {
        v[k] = x.clone();
    }
    std::fs::write(path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

/// The real weights with their own file in the copy, for editing.
fn own_weights(m: &Path) -> (PathBuf, Vec<u8>) {
    let path = m.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    (path, bytes)
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// Replaces the first `from` with `to` (same length) in `bytes[range]`.
fn patch_text(bytes: &mut [u8], limit: usize, from: &str, to: &str) {
    assert_eq!(from.len(), to.len(), "same-length edits keep offsets valid");
    let hay = &bytes[..limit];
    let at = hay
        .windows(from.len())
        .position(|w| w == from.as_bytes())
        .unwrap_or_else(|| panic!("{from} not in the header"));
    bytes[at..at + to.len()].copy_from_slice(to.as_bytes());
}

fn gstr(s: &[u8]) -> Vec<u8> {
    let mut v = (s.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(s);
    v
}

/// A GGUF v3 file with no tensors and one metadata pair `junk.blob`: a u8
/// array with `claim` elements of which `real` are present.
fn gguf_u8_array(claim: u64, real: usize) -> Vec<u8> {
    let mut v = b"GGUF".to_vec();
    v.extend_from_slice(&3u32.to_le_bytes());
    v.extend_from_slice(&0u64.to_le_bytes());
    v.extend_from_slice(&1u64.to_le_bytes());
    v.extend_from_slice(&gstr(b"junk.blob"));
    v.extend_from_slice(&9u32.to_le_bytes());
    v.extend_from_slice(&0u32.to_le_bytes());
    v.extend_from_slice(&claim.to_le_bytes());
    v.resize(v.len() + real, 7);
    v
}

/// Byte offsets into a GGUF header: each metadata value (with its type) and
/// each tensor info's name and type field.
struct GgufLayout {
    values: Vec<(String, u32, usize)>,
    tensors: Vec<(String, usize, usize)>,
}

fn gguf_layout(b: &[u8]) -> GgufLayout {
    let u32_at = |p: usize| u32::from_le_bytes(b[p..p + 4].try_into().unwrap());
    let u64_at = |p: usize| u64::from_le_bytes(b[p..p + 8].try_into().unwrap()) as usize;
    fn skip(b: &[u8], ty: u32, p: usize) -> usize {
        let u64_at = |p: usize| u64::from_le_bytes(b[p..p + 8].try_into().unwrap()) as usize;
        match ty {
            0 | 1 | 7 => p + 1,
            2 | 3 => p + 2,
            4..=6 => p + 4,
            10..=12 => p + 8,
            8 => p + 8 + u64_at(p),
            9 => {
                let elem = u32::from_le_bytes(b[p..p + 4].try_into().unwrap());
                let n = u64_at(p + 4);
                (0..n).fold(p + 12, |q, _| skip(b, elem, q))
            }
            t => panic!("value type {t}"),
        }
    }
    let (n_t, n_kv) = (u64_at(8), u64_at(16));
    let mut p = 24;
    let mut values = vec![];
    for _ in 0..n_kv {
        let n = u64_at(p);
        let key = String::from_utf8_lossy(&b[p + 8..p + 8 + n]).into_owned();
        p += 8 + n;
        let ty = u32_at(p);
        values.push((key, ty, p + 4));
        p = skip(b, ty, p + 4);
    }
    let mut tensors = vec![];
    for _ in 0..n_t {
        let n = u64_at(p);
        let name = String::from_utf8_lossy(&b[p + 8..p + 8 + n]).into_owned();
        let name_at = p + 8;
        p += 8 + n;
        let dims = u32_at(p) as usize;
        p += 4 + 8 * dims;
        tensors.push((name, name_at, p));
        p += 4 + 8;
    }
    GgufLayout { values, tensors }
}

/// Builds the row's input under `tmp` and returns the paths to substitute.
fn setup(row: &Row, tmp: &Path) -> Paths {
    let mut p = Paths {
        m: minilm(),
        g: smollm2(),
        file: tmp.join("input"),
        tmp: tmp.to_path_buf(),
    };
    let Some(s) = &row.setup else { return p };
    match s.kind.as_str() {
        "minilm"
        | "minilm_poison"
        | "minilm_file"
        | "minilm_remove"
        | "safetensors_edit"
        | "safetensors_truncate" => {
            p.m = tmp.join("minilm");
            copy_minilm(&p.m);
            merge_json(&p.m.join("config.json"), &s.config);
            merge_json(&p.m.join("sentence_bert_config.json"), &s.st_config);
        }
        _ => {}
    }
    match s.kind.as_str() {
        "minilm" => {}
        "minilm_poison" => {
            let (path, mut bytes) = own_weights(&p.m);
            let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
            let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
            let name = s.tensor.as_deref().unwrap();
            let start = 8 + n + header[name]["data_offsets"][0].as_u64().unwrap() as usize;
            let v = match s.value.as_deref().unwrap() {
                "nan" => f32::NAN,
                "inf" => f32::INFINITY,
                other => panic!("poison value {other}"),
            };
            bytes[start..start + 4].copy_from_slice(&v.to_le_bytes());
            std::fs::write(path, bytes).unwrap();
        }
        "safetensors_edit" => {
            let (path, mut bytes) = own_weights(&p.m);
            let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
            patch_text(
                &mut bytes,
                8 + n,
                s.from.as_deref().unwrap(),
                s.to.as_deref().unwrap(),
            );
            std::fs::write(path, bytes).unwrap();
        }
        "safetensors_truncate" => {
            let (path, bytes) = own_weights(&p.m);
            std::fs::write(path, &bytes[..s.len.unwrap()]).unwrap();
        }
        "minilm_file" => {
            let path = p.m.join(s.file.as_deref().unwrap());
            let _ = std::fs::remove_file(&path);
            let bytes = match (&s.text, &s.hex) {
                (Some(t), _) => t.as_bytes().to_vec(),
                (None, Some(h)) => hex(h),
                _ => panic!("minilm_file needs text or hex"),
            };
            std::fs::write(path, bytes).unwrap();
        }
        "minilm_remove" => std::fs::remove_file(p.m.join(s.file.as_deref().unwrap())).unwrap(),
        "lines" => {
            let mut f = std::io::BufWriter::new(std::fs::File::create(&p.file).unwrap());
            for i in 0..s.lines.unwrap() {
                writeln!(f, "sentence number {i} of a long input file").unwrap();
            }
        }
        "dir" => std::fs::create_dir_all(&p.file).unwrap(),
        "gguf_crafted" => {
            p.file = tmp.join("crafted.gguf");
            let bytes = match s.content.as_deref().unwrap() {
                "u8_array_claim_2e60" => gguf_u8_array(1 << 60, 64),
                "u8_array_100mb" => gguf_u8_array(100 << 20, 100 << 20),
                "bad_magic" => b"GGUX\x03\0\0\0".iter().copied().chain([0; 64]).collect(),
                other => panic!("gguf content {other}"),
            };
            std::fs::write(&p.file, bytes).unwrap();
        }
        "gguf_truncate" => {
            p.g = tmp.join("model.gguf");
            let bytes = std::fs::read(smollm2()).unwrap();
            std::fs::write(&p.g, &bytes[..s.len.unwrap()]).unwrap();
        }
        "gguf_edit" => {
            p.g = tmp.join("model.gguf");
            let mut bytes = std::fs::read(smollm2()).unwrap();
            let layout = gguf_layout(&bytes);
            if let Some(t) = &s.tensor {
                let &(_, name_at, type_at) = layout
                    .tensors
                    .iter()
                    .find(|x| &x.0 == t)
                    .unwrap_or_else(|| panic!("no tensor {t}"));
                if let Some(id) = s.type_id {
                    bytes[type_at..type_at + 4].copy_from_slice(&id.to_le_bytes());
                }
                if let Some(r) = &s.rename {
                    assert_eq!(r.len(), t.len());
                    bytes[name_at..name_at + r.len()].copy_from_slice(r.as_bytes());
                }
            }
            if let Some(k) = &s.key {
                let &(_, ty, at) = layout
                    .values
                    .iter()
                    .find(|x| &x.0 == k)
                    .unwrap_or_else(|| panic!("no key {k}"));
                assert_eq!(ty, 4, "{k} is a u32");
                bytes[at..at + 4].copy_from_slice(&s.u32.unwrap().to_le_bytes());
            }
            std::fs::write(&p.g, bytes).unwrap();
        }
        other => panic!("unknown setup kind {other:?}"),
    }
    p
}

struct Outcome {
    code: Option<i32>,
    signal: Option<i32>,
    stderr: String,
    stdout_head: String,
    peak_rss_mb: f64,
    wall_s: f64,
    killed: Option<String>,
}

fn vm_hwm_kb(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Drains a pipe on a thread, keeping the first `keep` bytes.
fn drain(mut r: impl Read + Send + 'static, keep: usize) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        let mut buf = [0u8; 1 << 16];
        loop {
            match r.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let room = keep.saturating_sub(kept.len()).min(n);
                    kept.extend_from_slice(&buf[..room]);
                }
            }
        }
        kept
    })
}

fn run(args: &[String], rss_mb: u64, wall_s: f64) -> Outcome {
    let t0 = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_rlx"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start rlx");
    let pid = child.id();
    let out = drain(child.stdout.take().unwrap(), 4096);
    let err = drain(child.stderr.take().unwrap(), 1 << 16);
    let mut peak_kb = 0u64;
    let mut killed = None;
    let status = loop {
        if let Some(kb) = vm_hwm_kb(pid) {
            peak_kb = peak_kb.max(kb);
        }
        if let Some(st) = child.try_wait().expect("wait for rlx") {
            break st;
        }
        if killed.is_none() {
            if peak_kb > rss_mb * 1024 {
                killed = Some(format!("killed: peak RSS over the {rss_mb} MB ceiling"));
            } else if t0.elapsed().as_secs_f64() > wall_s {
                killed = Some(format!(
                    "killed: still running after the {wall_s} s ceiling"
                ));
            }
            if killed.is_some() {
                let _ = child.kill();
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let wall = t0.elapsed().as_secs_f64();
    Outcome {
        code: status.code(),
        signal: status.signal(),
        stderr: String::from_utf8_lossy(&err.join().unwrap()).into_owned(),
        stdout_head: String::from_utf8_lossy(&out.join().unwrap()).into_owned(),
        peak_rss_mb: peak_kb as f64 / 1024.0,
        wall_s: wall,
        killed,
    }
}

/// Why the row failed, or `None` if it passed.
fn check(row: &Row, p: &Paths, o: &Outcome) -> Option<String> {
    if let Some(k) = &o.killed {
        return Some(k.clone());
    }
    let Some(code) = o.code else {
        return Some(format!("terminated by signal {:?}", o.signal));
    };
    if code == 101 || o.stderr.contains("panicked at") {
        return Some(format!("panicked (exit {code})"));
    }
    match row.exit.as_str() {
        "nonzero" if code == 0 => return Some("exited 0, expected an error".into()),
        "nonzero" | "any" => {}
        other => panic!("{}: unknown exit rule {other:?}", row.name),
    }
    if code != 0 {
        let err = o.stderr.to_lowercase();
        for group in &row.stderr {
            let alts: Vec<String> = group.iter().map(|a| p.fill(a).to_lowercase()).collect();
            if !alts.iter().any(|a| err.contains(a.as_str())) {
                return Some(format!("stderr names none of {alts:?}"));
            }
        }
    }
    if o.peak_rss_mb > row.rss_mb as f64 {
        return Some(format!(
            "peak RSS {:.0} MB over {} MB",
            o.peak_rss_mb, row.rss_mb
        ));
    }
    if o.wall_s > row.wall_s {
        return Some(format!("took {:.1} s, ceiling {} s", o.wall_s, row.wall_s));
    }
    None
}

/// The line to show for stderr: a panic's message, else the last line.
fn last_line(s: &str) -> String {
    let lines: Vec<&str> = s.lines().filter(|l| !l.trim().is_empty()).collect();
    let l = match lines
        .iter()
        .position(|l| l.contains("panicked at") || l.contains("memory allocation of"))
    {
        Some(i) => lines[i..]
            .iter()
            .take(2)
            .copied()
            .collect::<Vec<_>>()
            .join(" "),
        None => lines.last().copied().unwrap_or("").to_string(),
    };
    l.chars().take(220).collect()
}

#[test]
fn table_is_well_formed() {
    let t = table();
    let mut names: Vec<&str> = t.rows.iter().map(|r| r.name.as_str()).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), t.rows.len(), "row names are unique");
    for r in &t.rows {
        assert!(!r.stderr.is_empty() && !r.case.is_empty(), "{}", r.name);
        assert!(["nonzero", "any"].contains(&r.exit.as_str()), "{}", r.name);
    }
}

#[test]
fn bad_input_table() {
    let only = std::env::var("RLX_BAD_INPUT").ok();
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("bad-input-{}", std::process::id()));
    let mut failed = vec![];
    let (mut passed, mut skipped) = (0, 0);
    for (i, row) in table().rows.into_iter().enumerate() {
        if only.as_deref().is_some_and(|s| !row.name.contains(s)) {
            continue;
        }
        if let Some(n) = row.needs.iter().find(|n| !available(n)) {
            println!(
                "SKIP {:<34} ({n} not fetched; run python3 scripts/fetch_models.py all)",
                row.name
            );
            skipped += 1;
            continue;
        }
        // Not named after the row: paths appear in messages, and a row name
        // like `weights-nan` would satisfy its own stderr check.
        let tmp = root.join(format!("row{i}"));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).unwrap();
        let paths = setup(&row, &tmp);
        let args: Vec<String> = row.args.iter().map(|a| paths.fill(a)).collect();
        let o = run(&args, row.rss_mb, row.wall_s);
        let verdict = check(&row, &paths, &o);
        println!(
            "{} {:<34} exit {:<4} rss {:>6.0} MB  {:>5.1} s  | {}{}",
            if verdict.is_none() { "PASS" } else { "FAIL" },
            row.name,
            o.code.map_or_else(
                || format!("sig{}", o.signal.unwrap_or(0)),
                |c| c.to_string()
            ),
            o.peak_rss_mb,
            o.wall_s,
            last_line(&o.stderr),
            if o.code == Some(0) && !o.stdout_head.is_empty() {
                format!("  [stdout: {}]", last_line(&o.stdout_head))
            } else {
                String::new()
            }
        );
        match verdict {
            None => passed += 1,
            Some(why) => {
                println!("     {}: {why} (case: {})", row.name, row.case);
                failed.push(format!("{}: {why}", row.name));
            }
        }
        let _ = std::fs::remove_dir_all(&tmp);
    }
    println!(
        "bad-input table: {passed} passed, {} failed, {skipped} skipped",
        failed.len()
    );
    assert!(
        failed.is_empty(),
        "{} rows failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
}
