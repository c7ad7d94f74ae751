//! `rlx embed`.

use crate::{DeviceArg, Mode};
use clap::{Args, ValueEnum};
use rlx::models::{EmbedDevice, EmbedOptions, SentenceEmbedder};
use std::io::{BufRead, Seek, SeekFrom, Write};
use std::path::PathBuf;

/// Output format.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum Format {
    /// One JSON array per line, in input order.
    Jsonl,
    /// One float32 .npy matrix `[n, dim]`.
    Npy,
}

/// Arguments of `rlx embed`.
#[derive(Args)]
pub struct EmbedArgs {
    /// Texts to embed. Without texts or --file, lines are read from stdin.
    texts: Vec<String>,
    /// Read one text per line from this file (streamed: embeddings are
    /// written batch by batch; lines over 64 KiB are truncated).
    #[arg(long)]
    file: Option<PathBuf>,
    /// A sentence-transformers directory (BERT, XLM-RoBERTa, MPNet or
    /// ModernBERT), or `minilm` / `mpnet` (all-MiniLM-L6-v2 /
    /// all-mpnet-base-v2, fetched if missing; default `minilm`).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Texts per forward pass (1 to 1024).
    #[arg(long, default_value_t = 32)]
    batch_size: usize,
    /// Execution mode (hybrid is faster and equally exact).
    #[arg(long, value_enum, default_value_t = Mode::Hybrid)]
    mode: Mode,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Jsonl)]
    format: Format,
    /// Write here instead of stdout (required for npy).
    #[arg(long, short)]
    output: Option<PathBuf>,
    /// Worker threads (1 to the number of cores; default: one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// Most MiB of compiled batch shapes (arena and plan each) kept for
    /// reuse; the least recently used beyond it are dropped. The weights
    /// are held once on top of this (~180 MB for MiniLM).
    #[arg(long, default_value_t = 512)]
    cache_mb: usize,
    /// Device (`cuda` needs a build with `--features cuda`).
    #[arg(long, value_enum, default_value_t = DeviceArg::Cpu)]
    device: DeviceArg,
    /// Arithmetic: f32 or bf16 (CPU: bf16 matmuls with f32 accumulation,
    /// AVX512-BF16 where present; not faster than f32 there), on CUDA also
    /// tf32 and f16.
    #[arg(long, default_value = "f32")]
    precision: rlx::Precision,
    /// CPU: store matmul weights as f16 (faster on short inputs, where
    /// streaming the weights dominates; embeddings within ~1e-4 of f32).
    #[arg(long)]
    f16_weights: bool,
}

/// The embedder's device for the arguments.
fn embed_device(a: &EmbedArgs) -> Result<EmbedDevice, String> {
    match a.device {
        DeviceArg::Cpu if !matches!(a.precision, rlx::Precision::F32 | rlx::Precision::Bf16) => {
            Err(format!(
                "--precision {}: the CPU backend runs f32 or bf16 (use --device cuda)",
                a.precision
            ))
        }
        DeviceArg::Cpu => Ok(EmbedDevice::Cpu),
        #[cfg(feature = "cuda")]
        DeviceArg::Cuda if a.f16_weights => {
            Err("--f16-weights is a CPU option (on CUDA use --precision f16)".into())
        }
        #[cfg(feature = "cuda")]
        DeviceArg::Cuda => {
            rlx::cuda::cuda_available().map_err(|e| format!("--device cuda: {e}"))?;
            Ok(EmbedDevice::Cuda(rlx::cuda::CudaOptions {
                hybrid: a.mode == Mode::Hybrid,
                precision: a.precision,
                ..Default::default()
            }))
        }
        #[cfg(not(feature = "cuda"))]
        DeviceArg::Cuda => Err("--device cuda: the CUDA backend is not part of this build".into()),
    }
}

/// Lines longer than this many bytes are truncated while reading (the
/// model reads at most its `max_seq_length` tokens, a few KB of text).
pub const MAX_LINE_BYTES: usize = 64 << 10;

/// Reads one text per line in bounded memory: at most [`MAX_LINE_BYTES`]
/// of a line are kept, the rest of it is skipped up to its newline.
struct LineReader<R> {
    inner: R,
    what: String,
    /// Lines returned so far.
    line: u64,
    /// Bytes consumed so far.
    bytes: u64,
    /// Lines truncated so far.
    truncated: u64,
}

impl<R: BufRead> LineReader<R> {
    fn new(inner: R, what: String) -> Self {
        LineReader {
            inner,
            what,
            line: 0,
            bytes: 0,
            truncated: 0,
        }
    }

    /// The next line without its `\n` (or `\r\n`), `None` at the end.
    /// Errors on a NUL byte (the input is not text) and on invalid UTF-8.
    fn next_line(&mut self) -> Result<Option<String>, String> {
        let mut buf: Vec<u8> = Vec::new();
        let mut cut = false;
        let mut any = false;
        let n = self.line + 1;
        loop {
            let chunk = match self.inner.fill_buf() {
                Ok(c) => c,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(format!("reading {}: line {n}: {e}", self.what)),
            };
            if chunk.is_empty() {
                if !any {
                    return Ok(None);
                }
                break;
            }
            any = true;
            let newline = chunk.iter().position(|&b| b == b'\n');
            let part = &chunk[..newline.unwrap_or(chunk.len())];
            if part.contains(&0) {
                return Err(format!(
                    "reading {}: line {n} contains a NUL byte: the input is not text \
                     (expected UTF-8 text, one input per line)",
                    self.what
                ));
            }
            let room = MAX_LINE_BYTES.saturating_sub(buf.len());
            cut |= part.len() > room;
            buf.extend_from_slice(&part[..part.len().min(room)]);
            let used = part.len() + usize::from(newline.is_some());
            self.inner.consume(used);
            self.bytes += used as u64;
            if newline.is_some() {
                break;
            }
        }
        self.line = n;
        if cut {
            self.truncated += 1;
            if self.truncated == 1 {
                eprintln!(
                    "warning: {}: line {n} is longer than {MAX_LINE_BYTES} bytes; \
                     its first {MAX_LINE_BYTES} bytes are embedded (so for every such line)",
                    self.what
                );
            }
            // Cut at a character boundary.
            if let Err(e) = std::str::from_utf8(&buf) {
                if e.error_len().is_none() {
                    buf.truncate(e.valid_up_to());
                }
            }
        } else if buf.last() == Some(&b'\r') {
            buf.pop();
        }
        String::from_utf8(buf)
            .map(Some)
            .map_err(|e| format!("reading {}: line {n}: not valid UTF-8 ({e})", self.what))
    }

    /// Up to `n` more lines.
    fn next_batch(&mut self, n: usize) -> Result<Vec<String>, String> {
        let mut v = Vec::with_capacity(n.min(1024));
        while v.len() < n {
            match self.next_line()? {
                Some(l) => v.push(l),
                None => break,
            }
        }
        Ok(v)
    }
}

/// Where the texts come from.
enum Input {
    Args(std::vec::IntoIter<String>),
    Lines(LineReader<Box<dyn BufRead>>),
}

impl Input {
    fn next_batch(&mut self, n: usize) -> Result<Vec<String>, String> {
        match self {
            Input::Args(it) => Ok(it.by_ref().take(n).collect()),
            Input::Lines(r) => r.next_batch(n),
        }
    }
}

/// Bytes reserved for the .npy header, rewritten with the row count at the end.
const NPY_HEADER_BYTES: usize = 128;

/// Where embeddings go, written batch by batch.
enum Sink {
    Jsonl {
        out: std::io::BufWriter<Box<dyn Write>>,
        what: String,
    },
    Npy {
        file: std::io::BufWriter<std::fs::File>,
        path: PathBuf,
        rows: u64,
        dim: usize,
    },
}

impl Sink {
    /// Create the output now, before any compute, so a bad `--output` or
    /// `--format` fails at once.
    fn open(format: Format, output: Option<&PathBuf>) -> Result<Sink, String> {
        let create = |p: &PathBuf| {
            std::fs::File::create(p)
                .map_err(|e| format!("--output {}: cannot create: {e}", p.display()))
        };
        match format {
            Format::Jsonl => {
                let (out, what): (Box<dyn Write>, String) = match output {
                    Some(p) => (Box::new(create(p)?), p.display().to_string()),
                    None => (Box::new(std::io::stdout()), "stdout".into()),
                };
                Ok(Sink::Jsonl {
                    out: std::io::BufWriter::new(out),
                    what,
                })
            }
            Format::Npy => {
                let p = output.ok_or(
                    "--format npy: needs --output FILE (a .npy file is binary and its header is written last)",
                )?;
                let mut file = create(p)?;
                let seekable = file
                    .write_all(&[b' '; NPY_HEADER_BYTES])
                    .and_then(|_| file.seek(SeekFrom::Start(NPY_HEADER_BYTES as u64)));
                if let Err(e) = seekable {
                    return Err(format!(
                        "--output {}: --format npy needs a regular (seekable) file: {e}",
                        p.display()
                    ));
                }
                Ok(Sink::Npy {
                    file: std::io::BufWriter::new(file),
                    path: p.clone(),
                    rows: 0,
                    dim: 0,
                })
            }
        }
    }

    /// Write one batch of embeddings and flush it.
    fn write(&mut self, rows: &[Vec<f32>]) -> Result<(), String> {
        match self {
            Sink::Jsonl { out, what } => {
                let fail = |e: std::io::Error| format!("writing {what}: {e}");
                for r in rows {
                    serde_json::to_writer(&mut *out, r)
                        .map_err(|e| format!("writing {what}: {e}"))?;
                    out.write_all(b"\n").map_err(fail)?;
                }
                out.flush().map_err(fail)
            }
            Sink::Npy {
                file,
                path,
                rows: n,
                dim,
            } => {
                let fail = |e: std::io::Error| format!("writing {}: {e}", path.display());
                for r in rows {
                    *dim = r.len();
                    for v in r {
                        file.write_all(&v.to_le_bytes()).map_err(fail)?;
                    }
                    *n += 1;
                }
                file.flush().map_err(fail)
            }
        }
    }

    /// Finish the file: the .npy header gets the shape of the rows written.
    fn finish(self, dim: usize) -> Result<(), String> {
        match self {
            Sink::Jsonl { .. } => Ok(()),
            Sink::Npy {
                file, path, rows, ..
            } => {
                let fail = |e: std::io::Error| format!("writing {}: {e}", path.display());
                let mut file = file.into_inner().map_err(|e| fail(e.into_error()))?;
                file.seek(SeekFrom::Start(0)).map_err(fail)?;
                file.write_all(&npy_header(rows, dim)).map_err(fail)?;
                file.flush().map_err(fail)
            }
        }
    }
}

/// Run `rlx embed`.
///
/// Texts are read and embedded `--batch-size` at a time and each batch's
/// embeddings are written (and flushed) before the next is read, so memory
/// does not grow with the input; see [`LineReader`] for long lines.
pub fn run(a: EmbedArgs) -> Result<(), String> {
    // Every flag is checked, and the output created, before any compute.
    let device = embed_device(&a)?;
    if a.batch_size == 0 || a.batch_size > MAX_BATCH {
        return Err(format!(
            "--batch-size {}: expected 1 to {MAX_BATCH}",
            a.batch_size
        ));
    }
    let threads = crate::check_threads(a.threads)?;
    let cache_bytes = a
        .cache_mb
        .checked_mul(1 << 20)
        .ok_or_else(|| format!("--cache-mb {}: too large for this machine", a.cache_mb))?;
    let mut input = if let Some(f) = &a.file {
        if !a.texts.is_empty() {
            return Err("give texts as arguments or --file, not both".into());
        }
        let file = std::fs::File::open(f).map_err(|e| format!("--file {}: {e}", f.display()))?;
        let reader: Box<dyn BufRead> = Box::new(std::io::BufReader::new(file));
        Input::Lines(LineReader::new(reader, f.display().to_string()))
    } else if !a.texts.is_empty() {
        Input::Args(a.texts.clone().into_iter())
    } else {
        let reader: Box<dyn BufRead> = Box::new(std::io::BufReader::new(std::io::stdin()));
        Input::Lines(LineReader::new(reader, "stdin".into()))
    };
    let file_len = a
        .file
        .as_ref()
        .and_then(|f| std::fs::metadata(f).ok())
        .filter(|m| m.is_file())
        .map(|m| m.len());
    let mut sink = Sink::open(a.format, a.output.as_ref())?;
    let dir = match &a.model {
        Some(d) if d.exists() => d.clone(),
        Some(d) => crate::embed_model_dir(&d.to_string_lossy())?,
        None => crate::embed_model_dir("minilm")?,
    };
    let opts = EmbedOptions {
        hybrid: a.mode == Mode::Hybrid,
        threads,
        optimize: true,
        f16_weights: a.f16_weights,
        bf16: a.device == DeviceArg::Cpu && a.precision == rlx::Precision::Bf16,
        cache_bytes,
        ..Default::default()
    };
    let mut model = SentenceEmbedder::load_on(&dir, opts, device).map_err(|e| e.to_string())?;
    let bar = file_len.filter(|&n| n > 1 << 20).map(|n| {
        let b = indicatif::ProgressBar::new(n);
        b.set_draw_target(indicatif::ProgressDrawTarget::stderr());
        b
    });
    let mut rows = 0u64;
    let result = (|| -> Result<(), String> {
        loop {
            let texts = input.next_batch(a.batch_size)?;
            if texts.is_empty() {
                break;
            }
            let refs: Vec<&str> = texts.iter().map(|s| s.as_str()).collect();
            // Grouped by length: each row is the text embedded alone.
            let emb = model
                .embed_many(&refs, a.batch_size)
                .map_err(|e| e.to_string())?;
            sink.write(&emb)?;
            rows += emb.len() as u64;
            if let (Some(b), Input::Lines(r)) = (&bar, &input) {
                b.set_position(r.bytes);
            }
        }
        Ok(())
    })();
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    if let Input::Lines(r) = &input {
        if r.truncated > 1 {
            eprintln!(
                "warning: {}: {} lines were longer than {MAX_LINE_BYTES} bytes and were truncated",
                r.what, r.truncated
            );
        }
    }
    // The .npy header is completed with the rows written, even after an error.
    let finished = sink.finish(model.dim());
    result?;
    finished?;
    if rows == 0 {
        return Err(match &a.file {
            Some(f) => format!("--file {}: the input is empty", f.display()),
            None => "no input: give texts as arguments, --file, or lines on stdin".into(),
        });
    }
    Ok(())
}

/// The largest `--batch-size`: a batch's activations grow with it (32 x 256
/// tokens of MiniLM already take ~100 MB).
pub const MAX_BATCH: usize = 1024;

/// The header of a little-endian float32 .npy file of shape `[rows, dim]`,
/// padded to [`NPY_HEADER_BYTES`].
fn npy_header(rows: u64, dim: usize) -> Vec<u8> {
    let mut header =
        format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, {dim}), }}");
    while 10 + header.len() + 1 < NPY_HEADER_BYTES {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend((header.len() as u16).to_le_bytes());
    out.extend(header.as_bytes());
    debug_assert_eq!(out.len(), NPY_HEADER_BYTES);
    out
}
