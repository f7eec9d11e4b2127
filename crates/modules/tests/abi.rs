//! Every host call of the ABI, with its results and error codes.

mod common;

use std::os::fd::OwnedFd;

use common::tmpdir;
use ferry_modules::abi::{ERR_ABSENT, ERR_BADF, ERR_INVAL, ERR_RANGE};
use ferry_modules::{Action, Limits, ModuleHost};

/// `on_data` runs a script of host calls, stores each result as an i32 at 0x800 + 4*i,
/// and emits those results as the last buffer.
const WAT: &str = r#"
(module
  (import "ferry" "buf_len" (func $len (param i32) (result i32)))
  (import "ferry" "buf_read" (func $read (param i32 i32 i32 i32) (result i32)))
  (import "ferry" "buf_new" (func $new (param i32 i32) (result i32)))
  (import "ferry" "buf_write" (func $write (param i32 i32 i32 i32) (result i32)))
  (import "ferry" "buf_prepend" (func $prepend (param i32 i32 i32) (result i32)))
  (import "ferry" "buf_slice" (func $slice (param i32 i32 i32) (result i32)))
  (import "ferry" "buf_drop" (func $drop (param i32) (result i32)))
  (import "ferry" "emit" (func $emit (param i32) (result i32)))
  (import "ferry" "emit_file" (func $emit_file (param i32 i64 i64) (result i32)))
  (import "ferry" "prop" (func $prop (param i32 i32 i32 i32) (result i32)))
  (import "ferry" "log" (func $log (param i32 i32 i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "[]Jkey")
  (data (i32.const 16) "nokey")
  (data (i32.const 32) "hello from a module")
  (global $i (mut i32) (i32.const 0))
  (func $r (param $v i32)
    (i32.store (i32.add (i32.const 0x800) (i32.shl (global.get $i) (i32.const 2))) (local.get $v))
    (global.set $i (i32.add (global.get $i) (i32.const 1))))
  (func (export "init") (result i32) (i32.const 0))
  (func (export "on_data") (param $h i32) (result i32)
    (local $s i32) (local $n i32)
    (call $r (call $len (local.get $h)))                                   ;; 0: 11
    (local.set $s (call $slice (local.get $h) (i32.const 6) (i32.const 5)))
    (call $r (call $prepend (local.get $s) (i32.const 0) (i32.const 1)))  ;; 1: 0
    (call $r (call $write (local.get $s) (call $len (local.get $s)) (i32.const 1) (i32.const 1))) ;; 2: 0
    (call $r (call $emit (local.get $s)))                                  ;; 3: 0  -> "[world]"
    (call $r (call $emit (local.get $s)))                                  ;; 4: BADF (moved)
    (call $r (call $read (local.get $h) (i32.const 0) (i32.const 0x100) (i32.const 5))) ;; 5: 5
    (local.set $n (call $new (i32.const 0x100) (i32.const 5)))
    (call $r (call $emit (local.get $n)))                                  ;; 6: 0  -> "hello"
    (call $r (call $write (local.get $h) (i32.const 0) (i32.const 2) (i32.const 1))) ;; 7: 0
    (call $r (call $read (local.get $h) (i32.const 9) (i32.const 0x100) (i32.const 100))) ;; 8: 2 (short)
    (call $r (call $read (local.get $h) (i32.const 12) (i32.const 0x100) (i32.const 1))) ;; 9: RANGE
    (call $r (call $read (local.get $h) (i32.const -1) (i32.const 0x100) (i32.const 1))) ;; 10: INVAL
    (call $r (call $slice (local.get $h) (i32.const 8) (i32.const 5)))     ;; 11: RANGE
    (call $r (call $len (i32.const 999)))                                  ;; 12: BADF
    (call $r (call $len (i32.const -5)))                                   ;; 13: BADF
    (call $r (call $prop (i32.const 3) (i32.const 3) (i32.const 0x200) (i32.const 2))) ;; 14: 5 ("value" cut to "va")
    (call $r (call $prop (i32.const 16) (i32.const 5) (i32.const 0x200) (i32.const 2))) ;; 15: ABSENT
    (call $r (call $emit_file (i32.const 0) (i64.const 2) (i64.const 5)))  ;; 16: 0
    (call $r (call $emit_file (i32.const 0) (i64.const 8) (i64.const 5)))  ;; 17: RANGE
    (call $r (call $emit_file (i32.const 0) (i64.const -1) (i64.const 1))) ;; 18: INVAL
    (call $r (call $emit_file (i32.const 1) (i64.const 0) (i64.const 1)))  ;; 19: BADF
    (call $r (call $emit_file (i32.const 0) (i64.const 10) (i64.const 0))) ;; 20: 0 (empty: no action)
    (call $log (i32.const 2) (i32.const 32) (i32.const 19))
    (call $r (call $emit (local.get $h)))                                  ;; 21: 0  -> "Jello world"
    (call $r (call $drop (local.get $h)))                                  ;; 22: BADF
    (call $r (i32.load16_u (i32.const 0x200)))                             ;; 23: "va"
    (drop (call $emit (call $new (i32.const 0x800) (i32.shl (global.get $i) (i32.const 2)))))
    (i32.const 0)))
"#;

#[test]
fn every_host_call_behaves_as_documented() {
    let dir = tmpdir("abi");
    let path = dir.join("ten");
    std::fs::write(&path, b"0123456789").expect("write");
    let file: OwnedFd = std::fs::File::open(&path).expect("open").into();

    let h = ModuleHost::new(Limits::default()).expect("host");
    let id = h.load(WAT.as_bytes()).expect("load");
    let (mut inst, actions) = h.start(id, &[("key", "value")], vec![file]).expect("start");
    assert!(actions.is_empty());
    let actions = inst.feed(b"hello world".to_vec()).expect("feed");

    let mut emits = Vec::new();
    let mut files = Vec::new();
    for a in &actions {
        match a {
            Action::Emit(b) => emits.push(b.clone()),
            Action::EmitFile { offset, len, .. } => files.push((*offset, *len)),
        }
    }
    assert_eq!(files, vec![(2, 5)]);
    assert_eq!(emits.len(), 4);
    assert_eq!(emits[0], b"[world]");
    assert_eq!(emits[1], b"hello");
    assert_eq!(emits[2], b"Jello world");
    let results: Vec<i32> = emits[3]
        .chunks(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let want = [
        11,
        0,
        0,
        0,
        ERR_BADF,
        5,
        0,
        0,
        2,
        ERR_RANGE,
        ERR_INVAL,
        ERR_RANGE,
        ERR_BADF,
        ERR_BADF,
        5,
        ERR_ABSENT,
        0,
        ERR_RANGE,
        ERR_INVAL,
        ERR_BADF,
        0,
        0,
        ERR_BADF,
        i32::from(u16::from_le_bytes(*b"va")),
    ];
    assert_eq!(results, want);
    // Everything emitted was handed over; nothing is held.
    assert_eq!(inst.held_bytes(), 0);
    // No on_close export: close just finishes.
    assert!(inst.close().expect("close").is_empty());
    assert!(inst.is_finished());
    assert!(matches!(
        inst.feed(vec![]),
        Err(ferry_modules::Error::Finished)
    ));
}

#[test]
fn start_costs_microseconds() {
    // Not a benchmark (see benches/e6.rs): a sanity bound that catches a start path
    // that compiles or maps memory from scratch.
    let h = ModuleHost::new(Limits::default()).expect("host");
    let id = h.load(WAT.as_bytes()).expect("load");
    let mut times = Vec::new();
    for _ in 0..2000 {
        let t = std::time::Instant::now();
        let r = h.start(id, &[("key", "value")], Vec::new()).expect("start");
        times.push(t.elapsed());
        drop(r);
    }
    times.sort();
    let p50 = times[times.len() / 2];
    assert!(
        p50 < std::time::Duration::from_micros(200),
        "start p50 {p50:?}"
    );
}

#[test]
fn spares_serve_start_and_hold_pool_slots() {
    let dir = tmpdir("spares");
    let path = dir.join("ten");
    std::fs::write(&path, b"0123456789").expect("write");
    let open = || -> OwnedFd { std::fs::File::open(&path).expect("open").into() };
    let h = ModuleHost::new(Limits {
        max_instances: 3,
        ..Limits::default()
    })
    .expect("host");
    let id = h.load(&common::example("http_file")).expect("load");
    assert_eq!(h.prewarm(id, 2).expect("prewarm"), 2);
    assert_eq!(h.prewarm(id, 1).expect("prewarm"), 2, "never shrinks");

    let mut live = Vec::new();
    for _ in 0..3 {
        // Two from spares, one fresh: each sees its own properties.
        let (inst, actions) = h
            .start(id, &[("content-length", "10")], vec![open()])
            .expect("start");
        let Action::Emit(head) = &actions[0] else {
            panic!("header first")
        };
        assert!(String::from_utf8_lossy(head).contains("Content-Length: 10\r\n"));
        assert!(matches!(
            actions[1],
            Action::EmitFile {
                offset: 0,
                len: 10,
                ..
            }
        ));
        live.push(inst);
    }
    // Three slots in use: no more instances, and no spares can be built.
    assert!(matches!(
        h.start(id, &[("content-length", "1")], vec![open()]),
        Err(ferry_modules::Error::NoCapacity(3))
    ));
    live.clear();
    assert_eq!(h.prewarm(id, 3).expect("prewarm"), 3);
    assert!(matches!(
        h.instantiate(id, &[] as &[(&str, &str)], Vec::new()),
        Err(ferry_modules::Error::NoCapacity(3))
    ));
    h.clear_spares();
    h.instantiate(id, &[] as &[(&str, &str)], Vec::new())
        .expect("slots back");
}
