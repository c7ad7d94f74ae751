//! `rlx plan --model DIR` on a Qwen3-Next HF directory (the random-init
//! reference of rlx-models' tests): the hybrid plan has compiled segments
//! between the GatedDeltaNet thunk ranges.

use std::path::Path;
use std::process::Command;

#[test]
fn plan_shows_segments_between_gdn_ranges() {
    let dir =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../rlx-models/tests/data/families/qwen3_next");
    for seq in ["1", "8"] {
        let out = Command::new(env!("CARGO_BIN_EXE_rlx"))
            .args(["plan", "--model"])
            .arg(&dir)
            .args(["--seq", seq, "--ctx", "64", "--json"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["graph"], format!("qwen3_next.step.{seq}"));
        assert_eq!(v["ops"]["GatedDeltaNet"], 3);
        assert!(v["compiled_segments"].as_u64().unwrap() > 0);
        let ranges = v["ranges"].as_array().unwrap();
        let gdn: Vec<(u64, u64)> = ranges
            .iter()
            .filter(|r| {
                r["ops"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|o| o["op"] == "GatedDeltaNet")
            })
            .map(|r| (r["start"].as_u64().unwrap(), r["end"].as_u64().unwrap()))
            .collect();
        assert_eq!(gdn.len(), 3);
        for w in gdn.windows(2) {
            let between = v["segments"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|s| {
                    s["first"].as_u64().unwrap() >= w[0].1 && s["last"].as_u64().unwrap() < w[1].0
                })
                .count();
            assert!(between > 0, "no compiled segment between {w:?}");
        }
    }
}

#[test]
fn plan_names_a_bad_config_key() {
    let tmp = std::env::temp_dir().join(format!("rlx_plan_q3n_{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    // A qwen3_next config with a bad key is routed to the Qwen3-Next loader
    // and refused with the key named.
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../rlx-models/tests/data/families/qwen3_next/config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src).unwrap()).unwrap();
    cfg["linear_conv_kernel_dim"] = 0.into();
    std::fs::write(tmp.join("config.json"), cfg.to_string()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_rlx"))
        .args(["plan", "--model"])
        .arg(&tmp)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && out.status.code().is_some());
    assert!(err.contains("linear_conv_kernel_dim"), "{err}");
    let _ = std::fs::remove_dir_all(tmp);
}
