//! `rlx rerank`.

use crate::Mode;
use clap::{Args, ValueEnum};
use rlx::models::EmbedOptions;
use rlx::Reranker;
use std::path::PathBuf;

/// Output format.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum RerankFormat {
    /// One JSON object: `{"query", "results": [{"index", "score", "document"}]}`, best first.
    Json,
    /// A table: rank, score, index, document, best first.
    Table,
}

/// Arguments of `rlx rerank`.
#[derive(Args)]
pub struct RerankArgs {
    /// A cross-encoder directory (BertForSequenceClassification with one
    /// label, as sentence-transformers' CrossEncoder saves it).
    #[arg(long)]
    model: PathBuf,
    /// The query.
    #[arg(long)]
    query: String,
    /// The documents to score against the query.
    #[arg(long, num_args = 1.., required = true)]
    docs: Vec<String>,
    /// Keep only the best N documents.
    #[arg(long)]
    top_n: Option<usize>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = RerankFormat::Json)]
    format: RerankFormat,
    /// Execution mode (hybrid is faster and equally exact).
    #[arg(long, value_enum, default_value_t = Mode::Hybrid)]
    mode: Mode,
    /// Worker threads (1 to the number of cores; default: one per core).
    #[arg(long)]
    threads: Option<usize>,
}

/// Run `rlx rerank`: score every document against the query, print them
/// best first.
pub fn run(a: RerankArgs) -> Result<(), String> {
    let threads = crate::check_threads(a.threads)?;
    if a.top_n == Some(0) {
        return Err("--top-n 0: expected at least 1".into());
    }
    let opts = EmbedOptions {
        hybrid: a.mode == Mode::Hybrid,
        threads,
        ..Default::default()
    };
    let mut model = Reranker::load_with(&a.model, opts).map_err(|e| e.to_string())?;
    let docs: Vec<&str> = a.docs.iter().map(String::as_str).collect();
    let mut ranked = model.rerank(&a.query, &docs).map_err(|e| e.to_string())?;
    ranked.truncate(a.top_n.unwrap_or(ranked.len()));
    match a.format {
        RerankFormat::Json => {
            let results: Vec<serde_json::Value> = ranked
                .iter()
                .map(|r| {
                    serde_json::json!({
                        "index": r.index,
                        "score": r.score,
                        "document": docs[r.index],
                    })
                })
                .collect();
            println!(
                "{}",
                serde_json::json!({"query": a.query, "results": results})
            );
        }
        RerankFormat::Table => {
            println!("{:>4}  {:>10}  {:>5}  document", "rank", "score", "index");
            for (i, r) in ranked.iter().enumerate() {
                println!(
                    "{:>4}  {:>10.6}  {:>5}  {}",
                    i + 1,
                    r.score,
                    r.index,
                    docs[r.index]
                );
            }
        }
    }
    Ok(())
}
