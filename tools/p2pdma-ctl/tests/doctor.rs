//! `p2pdma-ctl doctor` and `list --all` on a machine without the module:
//! a report that exits 0, and argument errors that do not.

use std::process::Command;

const CTL: &str = env!("CARGO_BIN_EXE_p2pdma-ctl");
const MANIFEST: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");

#[test]
fn doctor_reports_bounce_without_the_module_and_exits_0() {
    let out = Command::new(CTL)
        .args([
            "--node",
            "/nonexistent/p2pdma",
            "doctor",
            MANIFEST,
            "--json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["path"], "bounce");
    let reason = j["reason"].as_str().unwrap();
    assert!(
        reason.contains("kernel module is not available"),
        "{reason}"
    );
    let checks = j["checks"].as_array().unwrap();
    let node = checks.iter().find(|c| c["name"] == "device node").unwrap();
    assert_eq!(node["status"], "fail");
    assert!(
        node["detail"]
            .as_str()
            .unwrap()
            .starts_with("/nonexistent/p2pdma does not exist"),
        "{node}"
    );
    assert_eq!(j["storage"]["given"], MANIFEST);

    let out = Command::new(CTL)
        .args(["--node", "/nonexistent/p2pdma", "doctor", "--dev", "3"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("CHECK "), "{text}");
    assert!(text.contains("\npath: bounce\n"), "{text}");
    assert!(text.contains("no storage path given"), "{text}");
}

#[test]
fn doctor_refuses_bad_arguments() {
    for args in [
        &["doctor", "--dev", "0", "--accel-pci", "0000:00:01.0"][..],
        &["doctor", "--accel-pci", "0000:00:20.0"],
        &["doctor", "--dev", "-1"],
        &["doctor", "a", "b"],
    ] {
        let out = Command::new(CTL).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?} was accepted");
    }
}

#[test]
fn list_all_shows_every_section_without_the_module() {
    let out = Command::new(CTL)
        .args(["--node", "/nonexistent/p2pdma", "list", "--all"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("accelerators (p2pdma module):\n  cannot open /nonexistent/p2pdma"),
        "{text}"
    );
    assert!(text.contains("\nnvme namespaces:\n"), "{text}");
    assert!(text.contains("\np2pmem providers:\n"), "{text}");

    let out = Command::new(CTL)
        .args(["--node", "/nonexistent/p2pdma", "list", "--all", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(j["accelerators"].is_null());
    assert!(j["module_error"]
        .as_str()
        .unwrap()
        .contains("/nonexistent/p2pdma"));
    assert!(j["nvme_namespaces"].is_array() && j["p2pmem_providers"].is_array());

    // Plain `list` still needs the module.
    let out = Command::new(CTL)
        .args(["--node", "/nonexistent/p2pdma", "list"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}
