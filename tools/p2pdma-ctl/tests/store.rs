//! `p2pdma-ctl store` on a file: format, put, ls, stat, get, rm, with the
//! bytes of what comes out compared with what went in.

use std::process::Command;

const CTL: &str = env!("CARGO_BIN_EXE_p2pdma-ctl");

fn ctl(device: &std::path::Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(CTL)
        .args([
            "--node",
            "/nonexistent/p2pdma",
            "--json",
            "store",
            "--device",
        ])
        .arg(device)
        .args(args)
        .env("P2PDMA_CACHE_DIR", "off")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn json(s: &str) -> serde_json::Value {
    serde_json::from_str(s.trim()).unwrap_or_else(|e| panic!("{e}: {s}"))
}

#[test]
fn a_file_goes_in_and_comes_out_the_same() {
    let dir = std::env::temp_dir().join(format!("p2pdma-ctl-store-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let dev = dir.join("store.img");
    std::fs::File::create(&dev)
        .unwrap()
        .set_len(32 << 20)
        .unwrap();
    let input = dir.join("in.bin");
    let mut rng = fastrand::Rng::with_seed(5);
    let data: Vec<u8> = (0..(9 << 20) + 4321).map(|_| rng.u8(..)).collect();
    std::fs::write(&input, &data).unwrap();

    let (ok, out, err) = ctl(&dev, &["format", "--max-objects", "16"]);
    assert!(ok, "{out}{err}");
    let (ok, out, err) = ctl(&dev, &["put", input.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    let id = json(&out)["id"].as_u64().unwrap();
    let (ok, out, _) = ctl(&dev, &["ls"]);
    assert!(ok);
    let objects = json(&out)["objects"].as_array().unwrap().clone();
    assert_eq!(objects.len(), 1);
    assert_eq!(objects[0]["size"].as_u64(), Some(data.len() as u64));
    let (ok, out, _) = ctl(&dev, &["stat", &id.to_string()]);
    assert!(ok);
    assert_eq!(json(&out)["size"].as_u64(), Some(data.len() as u64));

    let output = dir.join("out.bin");
    let (ok, out, err) = ctl(&dev, &["get", &id.to_string(), output.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    assert!(
        std::fs::read(&output).unwrap() == data,
        "the object's bytes differ from the file's"
    );

    let (ok, _, _) = ctl(&dev, &["rm", &id.to_string()]);
    assert!(ok);
    let (ok, out, err) = ctl(&dev, &["get", &id.to_string(), output.to_str().unwrap()]);
    assert!(!ok, "{out}");
    assert!(err.contains(&format!("no object {id}")), "{err}");
    let (_, out, _) = ctl(&dev, &["ls"]);
    assert!(json(&out)["objects"].as_array().unwrap().is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn object_counts_whose_map_size_overflows_are_refused_and_leave_the_store() {
    let dir = std::env::temp_dir().join(format!("p2pdma-ctl-store-big-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let dev = dir.join("store.img");
    std::fs::File::create(&dev)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let (ok, out, err) = ctl(&dev, &["format", "--max-objects", "16"]);
    assert!(ok, "{out}{err}");
    // 16 + 32 n wraps around for these: a map of one block would do.
    for n in [1u64 << 59, (1 << 59) + 1, 3 << 59, u64::MAX] {
        let (ok, out, err) = ctl(&dev, &["format", "--max-objects", &n.to_string()]);
        assert!(!ok, "{n} objects formatted: {out}");
        assert!(err.contains(&format!("a store for {n} objects")), "{err}");
    }
    // The refused formats wrote nothing: the store is still there.
    let (ok, out, err) = ctl(&dev, &["ls"]);
    assert!(ok, "{out}{err}");
    assert!(json(&out)["objects"].as_array().unwrap().is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}
