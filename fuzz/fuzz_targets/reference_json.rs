//! The readers of the PyTorch reference files (`minilm_embeddings.json`,
//! `smollm2_logits.json`) that the parity tests use, on every input.

#![no_main]

#[path = "../../crates/rlx-models/tests/support/reference.rs"]
mod reference;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(cases) = reference::parse_minilm_embeddings(text) {
        for c in &cases {
            let _ = (c.text.len(), c.ids.len(), c.emb.len());
        }
    }
    if let Ok(r) = reference::parse_smollm2_logits(text) {
        for c in &r.cases {
            let _ = (
                &c.prompt,
                c.top10_next[0],
                &c.greedy_ids[..8],
                &c.prompt_ids,
            );
        }
    }
});
