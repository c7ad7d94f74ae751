//! Checks against the real all-MiniLM-L6-v2 safetensors file (see
//! /work/shared/reference/README.md), if fetched to
//! `$RLX_MODELS_DIR/all-minilm-l6-v2/model.safetensors`
//! (`RLX_MODELS_DIR` defaults to `~/.cache/rlx/models`).

use std::path::PathBuf;

use rlx_formats::SafeTensorsFile;
use rlx_ir::DType;

fn model_path() -> Option<PathBuf> {
    let dir = match std::env::var_os("RLX_MODELS_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME")?).join(".cache/rlx/models"),
    };
    let p = dir.join("all-minilm-l6-v2/model.safetensors");
    p.exists().then_some(p)
}

#[test]
fn minilm_safetensors_structure() {
    let Some(path) = model_path() else {
        println!("skipped: model not fetched");
        return;
    };
    let f = SafeTensorsFile::open(&path).unwrap();
    let names = f.names();
    assert_eq!(names.len(), 104);
    let n_f32 = names
        .iter()
        .filter(|n| matches!(f.info(n), Some((DType::F32, _))))
        .count();
    assert_eq!(n_f32, 103);
    assert!(names.iter().all(|n| !n.starts_with("bert.")));
    assert!(names.iter().any(|n| n.starts_with("pooler.")));

    assert_eq!(
        f.info("embeddings.position_ids"),
        Some((DType::I64, vec![1, 512]))
    );
    let pos = f.tensor_i64("embeddings.position_ids", &[1, 512]).unwrap();
    assert!(pos.iter().enumerate().all(|(i, &p)| p == i as i64));

    let emb = f
        .tensor_f32("embeddings.word_embeddings.weight", &[30522, 384])
        .unwrap();
    assert!(emb.iter().all(|x| x.is_finite()));
    let g = f
        .tensor_f32("encoder.layer.0.attention.output.LayerNorm.weight", &[384])
        .unwrap();
    assert!(g.iter().all(|x| x.is_finite()) && g.iter().any(|&x| x != 0.0));
    assert!(f
        .tensor_f32("embeddings.word_embeddings.weight", &[384, 30522])
        .is_err());
}
