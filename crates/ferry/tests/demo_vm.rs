//! `ferry demo --vm`: the demo's file fetched from a QEMU guest (TCG here) whose network
//! `ferry vm` serves, compared with the file by SHA-256; and the message that names the
//! script when the guest image is missing.

mod common;
use common::*;
use std::time::Duration;

#[test]
fn the_demo_fetches_the_same_bytes_from_a_guest_through_ferry_vm() {
    if !can_run(&["curl", "ip", "qemu-system-x86_64", "sha256sum"]) {
        return;
    }
    let Some(dir) = guest_dir() else { return };
    let mut c = ferry();
    c.args(["demo", "--size-mb", "8", "--vm", "--guest"])
        .arg(&dir);
    let o = output_within(c, Duration::from_secs(240));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "demo: {out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let line = out
        .lines()
        .find(|l| l.split_whitespace().next() == Some("ferry-vm"))
        .unwrap_or_else(|| panic!("no ferry-vm row: {out}"));
    assert!(line.contains(" true ") && line.ends_with("true"), "{line}");
    assert!(line.contains(&(8u64 << 20).to_string()), "{line}");
    assert!(out.contains("guest: accelerator "), "{out}");
}

#[test]
fn the_demo_names_the_script_when_the_guest_image_is_missing() {
    let dir = TempDir::new("demo-vm");
    let o = ferry()
        .args(["demo", "--vm", "--guest"])
        .arg(dir.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(125), "{err}");
    assert!(
        err.contains("scripts/guest-image.sh") || err.contains("qemu-system-x86_64 not found"),
        "{err}"
    );
}
