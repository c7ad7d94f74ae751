//! `rlx embed` limits and failure behaviour: flags refused before any
//! compute, streaming input and output, long lines and non-text input, and
//! peak memory that does not grow with the input.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const RLX: &str = env!("CARGO_BIN_EXE_rlx");

fn model_dir() -> Option<PathBuf> {
    let root = std::env::var_os("RLX_MODELS_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/rlx/models")))?;
    let dir = root.join("all-minilm-l6-v2");
    dir.join("model.safetensors").exists().then_some(dir)
}

/// A scratch directory for one test.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("rlx-embed-limits-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Run `rlx` with `args`, returning (success, stdout, stderr, seconds).
fn rlx(args: &[&str]) -> (bool, String, String, f64) {
    let t = Instant::now();
    let out = Command::new(RLX).args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        t.elapsed().as_secs_f64(),
    )
}

#[test]
fn threads_beyond_the_cores_are_refused_at_once() {
    // A model directory that does not exist: the flag must be refused
    // before anything is loaded.
    for cmd in [
        vec![
            "embed",
            "--model",
            "/nonexistent/model",
            "--threads",
            "100000",
            "x",
        ],
        vec![
            "embed",
            "--model",
            "/nonexistent/model",
            "--threads",
            "0",
            "x",
        ],
        vec![
            "bench",
            "--model",
            "/nonexistent/model",
            "--threads",
            "100000",
        ],
        vec!["bench-llm", "--synthetic", "--threads", "100000"],
    ] {
        let (ok, out, err, secs) = rlx(&cmd);
        assert!(!ok, "{cmd:?} succeeded");
        assert!(out.is_empty(), "{cmd:?} printed {out:?}");
        let value = cmd[cmd.iter().position(|a| *a == "--threads").unwrap() + 1];
        assert!(
            err.contains(&format!("--threads {value}: expected 1 to ")),
            "{cmd:?}: {err}"
        );
        assert!(secs < 10.0, "{cmd:?} took {secs:.1} s");
    }
}

#[test]
fn bad_output_is_refused_before_compute() {
    // Again a model that does not exist: the output error must come first.
    let (ok, _, err, _) = rlx(&[
        "embed",
        "--model",
        "/nonexistent/model",
        "-o",
        "/nonexistent/dir/x.npy",
        "--format",
        "npy",
        "x",
    ]);
    assert!(!ok);
    assert!(
        err.contains("--output /nonexistent/dir/x.npy: cannot create"),
        "{err}"
    );
    let (ok, _, err, _) = rlx(&[
        "embed",
        "--model",
        "/nonexistent/model",
        "--format",
        "npy",
        "x",
    ]);
    assert!(!ok);
    assert!(err.contains("--format npy: needs --output FILE"), "{err}");
    let (ok, _, err, _) = rlx(&[
        "embed",
        "--model",
        "/nonexistent/model",
        "--batch-size",
        "0",
        "x",
    ]);
    assert!(!ok);
    assert!(err.contains("--batch-size 0: expected 1 to 1024"), "{err}");
}

#[test]
fn dev_zero_is_refused_as_not_text() {
    let Some(m) = model_dir() else {
        println!("skipped: model not fetched");
        return;
    };
    let (ok, out, err, secs) = rlx(&[
        "embed",
        "--model",
        m.to_str().unwrap(),
        "--file",
        "/dev/zero",
    ]);
    assert!(!ok);
    assert!(out.is_empty());
    assert!(err.contains("line 1 contains a NUL byte"), "{err}");
    assert!(secs < 30.0, "took {secs:.1} s");
}

fn parse_rows(jsonl: &str) -> Vec<Vec<f32>> {
    jsonl
        .lines()
        .map(|l| serde_json::from_str::<Vec<f32>>(l).unwrap())
        .collect()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn a_line_over_64_kib_is_truncated_not_buffered() {
    let Some(m) = model_dir() else {
        println!("skipped: model not fetched");
        return;
    };
    let d = scratch("long");
    let f = d.join("in.txt");
    // 1 MB of words on one line, then a short line.
    let long = "word ".repeat(200_000);
    std::fs::write(&f, format!("{long}\nhello world\n")).unwrap();
    let (ok, out, err, _) = rlx(&[
        "embed",
        "--model",
        m.to_str().unwrap(),
        "--file",
        f.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(err.contains("line 1 is longer than 65536 bytes"), "{err}");
    let rows = parse_rows(&out);
    assert_eq!(rows.len(), 2);
    // The model reads 256 tokens at most: the truncated line embeds like
    // 300 words of it, and the next line is read normally.
    let short = "word ".repeat(300);
    let (ok, want, _, _) = rlx(&[
        "embed",
        "--model",
        m.to_str().unwrap(),
        short.trim_end(),
        "hello world",
    ]);
    assert!(ok);
    let want = parse_rows(&want);
    assert!(max_diff(&rows[0], &want[0]) < 1e-5);
    assert!(max_diff(&rows[1], &want[1]) < 1e-5);
    std::fs::remove_dir_all(d).ok();
}

#[test]
fn stdin_batches_are_written_before_the_input_ends() {
    let Some(m) = model_dir() else {
        println!("skipped: model not fetched");
        return;
    };
    let mut child = Command::new(RLX)
        .args(["embed", "--model", m.to_str().unwrap(), "--batch-size", "2"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"first line\nsecond line\n").unwrap();
    stdin.flush().unwrap();
    // stdin is still open: the first batch's two rows must arrive anyway.
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    for _ in 0..2 {
        line.clear();
        out.read_line(&mut line).unwrap();
        assert_eq!(serde_json::from_str::<Vec<f32>>(&line).unwrap().len(), 384);
    }
    stdin.write_all(b"third\n").unwrap();
    drop(stdin);
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(serde_json::from_str::<Vec<f32>>(&line).unwrap().len(), 384);
    assert!(child.wait().unwrap().success());
}

#[test]
fn npy_output_streams_and_has_the_right_header() {
    let Some(m) = model_dir() else {
        println!("skipped: model not fetched");
        return;
    };
    let d = scratch("npy");
    let (f, o) = (d.join("in.txt"), d.join("out.npy"));
    let lines: Vec<String> = (1..=5).map(|i| "word ".repeat(i)).collect();
    std::fs::write(&f, lines.join("\n")).unwrap();
    let (ok, _, err, _) = rlx(&[
        "embed",
        "--model",
        m.to_str().unwrap(),
        "--file",
        f.to_str().unwrap(),
        "--batch-size",
        "2",
        "--format",
        "npy",
        "-o",
        o.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let bytes = std::fs::read(&o).unwrap();
    assert_eq!(&bytes[..8], b"\x93NUMPY\x01\x00");
    let hlen = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let header = std::str::from_utf8(&bytes[10..10 + hlen]).unwrap();
    assert!(header.contains("'shape': (5, 384)"), "{header}");
    assert_eq!(bytes.len(), 10 + hlen + 5 * 384 * 4);
    let (ok, json, _, _) = rlx(&[
        "embed",
        "--model",
        m.to_str().unwrap(),
        "--file",
        f.to_str().unwrap(),
    ]);
    assert!(ok);
    let want = parse_rows(&json);
    for (i, w) in want.iter().enumerate() {
        let at = 10 + hlen + i * 384 * 4;
        let row: Vec<f32> = bytes[at..at + 384 * 4]
            .chunks(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert!(max_diff(&row, w) < 1e-6, "row {i}");
    }
    std::fs::remove_dir_all(d).ok();
}

/// Run `rlx` to completion, polling its peak resident set (`VmHWM`) every
/// 20 ms. Returns the peak in bytes and the number of stdout lines.
fn peak_rss(args: &[&str]) -> (u64, usize) {
    let mut child = Command::new(RLX)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = format!("/proc/{}/status", child.id());
    let stdout = child.stdout.take().unwrap();
    let counter = std::thread::spawn(move || BufReader::new(stdout).lines().count());
    let mut peak = 0u64;
    let exit = loop {
        if let Ok(s) = std::fs::read_to_string(&status) {
            if let Some(kb) = s
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            {
                peak = peak.max(kb * 1024);
            }
        }
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(exit.success(), "{args:?}: {err}");
    (peak, counter.join().unwrap())
}

fn write_lines(path: &Path, lines: impl Iterator<Item = String>) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    for l in lines {
        writeln!(f, "{l}").unwrap();
    }
}

/// Peak memory does not grow with the number of lines: 384 and 3,840
/// lines peak within 15% of each other. Each line is 32 KiB of spaces and
/// then 1 to 24 words (blocks of 16 lines of one length, all lengths in
/// either run, so both compile the same shapes): cheap to embed (spaces are
/// no tokens), but a reader that kept the input (or an output kept whole)
/// would grow by over 110 MB.
#[test]
fn peak_memory_does_not_grow_with_the_input() {
    let Some(m) = model_dir() else {
        println!("skipped: model not fetched");
        return;
    };
    let d = scratch("rss");
    let pad = " ".repeat(32 << 10);
    let run = |n: usize| {
        let f = d.join(format!("lines{n}.txt"));
        write_lines(
            &f,
            (0..n).map(|i| format!("{pad}{}", "word ".repeat(1 + (i / 16) % 24))),
        );
        let t = Instant::now();
        let (peak, rows) = peak_rss(&[
            "embed",
            "--model",
            m.to_str().unwrap(),
            "--file",
            f.to_str().unwrap(),
            "--batch-size",
            "32",
        ]);
        assert_eq!(rows, n);
        println!(
            "{n} lines: peak RSS {:.0} MiB in {:.1} s",
            peak as f64 / (1 << 20) as f64,
            t.elapsed().as_secs_f64()
        );
        std::fs::remove_file(&f).ok();
        peak
    };
    let small = run(384);
    let large = run(3_840);
    let mb = |b: u64| b as f64 / (1 << 20) as f64;
    assert!(
        (large as f64) <= small as f64 * 1.15,
        "peak RSS grew from {:.0} MiB (384 lines) to {:.0} MiB (3,840 lines)",
        mb(small),
        mb(large)
    );
    std::fs::remove_dir_all(d).ok();
}

/// The reproduction: 254 lengths (1 to 254 words), 8 lines each, in
/// batches of 8, once OOM-killed at 23.6 GB, stays under 1.5 GB.
#[test]
#[ignore = "~100 s on 2 shared cores (2032 lines up to 256 tokens); run with --ignored"]
fn every_length_to_254_words_stays_under_1_5_gb() {
    let Some(m) = model_dir() else {
        println!("skipped: model not fetched");
        return;
    };
    let d = scratch("lengths");
    let f = d.join("l.txt");
    write_lines(
        &f,
        (1..255).flat_map(|i| std::iter::repeat_n("word ".repeat(i), 8)),
    );
    let t = Instant::now();
    let (peak, rows) = peak_rss(&[
        "embed",
        "--model",
        m.to_str().unwrap(),
        "--batch-size",
        "8",
        "--file",
        f.to_str().unwrap(),
    ]);
    assert_eq!(rows, 2032);
    println!(
        "2032 lines of 1..254 words: peak RSS {:.0} MiB in {:.1} s",
        peak as f64 / (1 << 20) as f64,
        t.elapsed().as_secs_f64()
    );
    assert!(peak < 1_500_000_000, "peak RSS {peak} bytes");
    std::fs::remove_dir_all(d).ok();
}
