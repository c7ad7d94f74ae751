//! The GGUF tokenizer built from GGUF metadata, then encode / decode /
//! stream-decode. Input: `u16 LE n`, `n` bytes of text, then a GGUF file.

#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;
use rlx_formats::GgufFile;
use rlx_models::gguf_tokenizer::GgufTokenizer;

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let n = (u16::from_le_bytes([data[0], data[1]]) as usize).min(data.len() - 2);
    let (text, gguf) = data[2..].split_at(n);
    let text = String::from_utf8_lossy(text);
    let path = common::write_scratch("tok.gguf", gguf);
    let Ok(f) = GgufFile::open(&path) else {
        return;
    };
    let Ok(tok) = GgufTokenizer::from_gguf(&f) else {
        return;
    };
    let vocab = tok.vocab_size() as u32;
    let _ = (
        tok.pre_tokenizer(),
        tok.bos_id(),
        tok.eos_id(),
        tok.pad_id(),
    );
    let _ = (tok.unk_id(), tok.add_bos_default(), tok.token_id(&text));
    for add_bos in [false, true] {
        if let Ok(ids) = tok.encode(&text, add_bos) {
            assert!(
                ids.iter().all(|&id| id < vocab),
                "encode gave an id >= vocab"
            );
            let _ = tok.decode(&ids).expect("ids from encode decode");
        }
    }
    // The text's bytes as ids, some out of range.
    let ids: Vec<u32> = text
        .as_bytes()
        .chunks(2)
        .map(|c| c.iter().fold(0u32, |a, &b| a << 8 | b as u32) % (vocab + 8))
        .collect();
    let _ = tok.decode(&ids);
    let mut stream = tok.stream_decoder();
    for &id in &ids {
        let _ = (tok.token_bytes(id), tok.token_text(id), tok.token_type(id));
        let _ = tok.is_end_of_generation(id);
        let _ = stream.push(id);
        let _ = stream.pending_bytes();
    }
    let _ = stream.finish();
});
