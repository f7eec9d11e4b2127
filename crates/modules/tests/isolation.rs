//! A module that loops, over-allocates, goes out of bounds or asks for capabilities it
//! does not have is stopped (or refused) alone; the host and other instances carry on.

mod common;

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use common::{curl, example, random_bytes, serve_once, tmpdir};
use ferry_modules::{Error, Interrupt, Limits, ModuleHost, perform};

fn host_with(deadline: Duration, memory_bytes: usize) -> ModuleHost {
    ModuleHost::new(Limits {
        memory_bytes,
        deadline,
        ..Limits::default()
    })
    .expect("host")
}

/// A module whose `on_data` body is `body`, with a 1-page memory.
fn module(body: &str) -> String {
    format!(
        r#"(module
             (import "ferry" "buf_drop" (func $buf_drop (param i32) (result i32)))
             (import "ferry" "buf_new" (func $buf_new (param i32 i32) (result i32)))
             (import "ferry" "emit" (func $emit (param i32) (result i32)))
             (memory (export "memory") 1)
             (func (export "init") (result i32) (i32.const 0))
             (func (export "on_data") (param $h i32) (result i32) {body}))"#
    )
}

const LOOP: &str = "(loop $l (br $l)) (i32.const 0)";

#[test]
fn infinite_loop_is_stopped_within_its_deadline() {
    let deadline = Duration::from_millis(20);
    let h = host_with(deadline, 1 << 20);
    let id = h.load(module(LOOP).as_bytes()).expect("load");
    for _ in 0..3 {
        let (mut inst, _) = h
            .start(id, &[] as &[(&str, &str)], Vec::new())
            .expect("start");
        let t = Instant::now();
        let e = inst.feed(b"go".to_vec()).unwrap_err();
        let took = t.elapsed();
        eprintln!("loop stopped after {took:?} (deadline {deadline:?})");
        assert!(matches!(e, Error::Deadline(d) if d == deadline), "{e}");
        assert!(took >= deadline, "stopped early: {took:?}");
        assert!(
            took < deadline * 10,
            "took {took:?} for a {deadline:?} deadline"
        );
        // A stopped instance cannot be fed again.
        assert!(matches!(inst.feed(b"again".to_vec()), Err(Error::Stopped)));
        assert!(matches!(inst.close(), Err(Error::Stopped)));
        assert!(inst.is_stopped());
    }
}

#[test]
fn loop_in_init_is_stopped_too() {
    let deadline = Duration::from_millis(15);
    let h = host_with(deadline, 1 << 20);
    let wat = r#"(module (memory (export "memory") 1)
        (func (export "init") (result i32) (loop $l (br $l)) (i32.const 0))
        (func (export "on_data") (param i32) (result i32) (i32.const 0)))"#;
    let id = h.load(wat.as_bytes()).expect("load");
    let t = Instant::now();
    let e = h.start(id, &[] as &[(&str, &str)], Vec::new()).unwrap_err();
    assert!(matches!(e, Error::Deadline(_)), "{e}");
    assert!(t.elapsed() < deadline * 10);
}

#[test]
fn fuel_interruption_stops_a_loop() {
    let h = ModuleHost::new(Limits {
        interrupt: Interrupt::Fuel(10_000_000),
        ..Limits::default()
    })
    .expect("host");
    let id = h.load(module(LOOP).as_bytes()).expect("load");
    let (mut inst, _) = h
        .start(id, &[] as &[(&str, &str)], Vec::new())
        .expect("start");
    assert!(matches!(inst.feed(vec![1]), Err(Error::Deadline(_))));
}

#[test]
fn memory_growth_beyond_the_cap_is_refused() {
    let h = host_with(Duration::from_millis(100), 1 << 20); // 16 pages
    // Within the cap: memory.grow works and returns the old size.
    let id = h.load(module("(if (i32.ne (memory.grow (i32.const 10)) (i32.const 1)) (then unreachable)) (i32.const 0)").as_bytes()).expect("load");
    let (mut inst, _) = h
        .start(id, &[] as &[(&str, &str)], Vec::new())
        .expect("start");
    inst.feed(vec![1]).expect("growth within the cap");
    // Beyond: the instance is stopped with MemoryLimit.
    let e = inst.feed(vec![1]).unwrap_err();
    assert!(matches!(e, Error::MemoryLimit(_)), "{e}");
    assert!(matches!(inst.feed(vec![1]), Err(Error::Stopped)));

    // A module that starts above the cap is refused at load.
    let big = r#"(module (memory (export "memory") 17)
        (func (export "init") (result i32) (i32.const 0))
        (func (export "on_data") (param i32) (result i32) (i32.const 0)))"#;
    assert!(matches!(h.load(big.as_bytes()), Err(Error::BadModule(_))));
}

#[test]
fn host_buffers_beyond_the_cap_are_refused() {
    let h = host_with(Duration::from_millis(500), 1 << 20);
    // Keeps making 64 KiB buffers without dropping them.
    let id = h
        .load(module("(loop $l (drop (call $buf_new (i32.const 0) (i32.const 65536))) (br $l)) (i32.const 0)").as_bytes())
        .expect("load");
    let (mut inst, _) = h
        .start(id, &[] as &[(&str, &str)], Vec::new())
        .expect("start");
    let e = inst.feed(vec![]).unwrap_err();
    assert!(matches!(e, Error::MemoryLimit(_)), "{e}");

    // Emitting does not escape the cap within one callback either.
    let id = h
        .load(module("(loop $l (drop (call $emit (call $buf_new (i32.const 0) (i32.const 65536)))) (br $l)) (i32.const 0)").as_bytes())
        .expect("load");
    let (mut inst, _) = h
        .start(id, &[] as &[(&str, &str)], Vec::new())
        .expect("start");
    let e = inst.feed(vec![]).unwrap_err();
    assert!(matches!(e, Error::MemoryLimit(_)), "{e}");

    // Handles are limited too (empty buffers cost no bytes).
    let id = h
        .load(module("(loop $l (drop (call $buf_new (i32.const 0) (i32.const 0))) (br $l)) (i32.const 0)").as_bytes())
        .expect("load");
    let (mut inst, _) = h
        .start(id, &[] as &[(&str, &str)], Vec::new())
        .expect("start");
    let e = inst.feed(vec![]).unwrap_err();
    assert!(matches!(e, Error::MemoryLimit(_)), "{e}");
}

#[test]
fn out_of_bounds_access_traps() {
    let h = host_with(Duration::from_millis(100), 1 << 20);
    let cases = [
        "(drop (i32.load (i32.const 65534))) (i32.const 0)",
        "(i32.store (i32.const -4) (i32.const 1)) (i32.const 0)",
        "(drop (i64.load (i32.const 0x7fffffff))) (i32.const 0)",
        // a host call handed a pointer outside the memory
        "(drop (call $buf_new (i32.const 65000) (i32.const 1000))) (i32.const 0)",
        "unreachable",
    ];
    for body in cases {
        let id = h.load(module(body).as_bytes()).expect("load");
        let (mut inst, _) = h
            .start(id, &[] as &[(&str, &str)], Vec::new())
            .expect("start");
        let e = inst.feed(vec![1, 2, 3]).unwrap_err();
        assert!(matches!(e, Error::Trap(_)), "{body}: {e}");
        assert!(matches!(inst.feed(vec![]), Err(Error::Stopped)));
    }
    // Recursion without end: stack overflow is a trap, not a crash.
    let wat = r#"(module (memory (export "memory") 1)
        (func $f (result i32) (i32.add (call $f) (i32.const 1)))
        (func (export "init") (result i32) (i32.const 0))
        (func (export "on_data") (param i32) (result i32) (call $f)))"#;
    let id = h.load(wat.as_bytes()).expect("load");
    let (mut inst, _) = h
        .start(id, &[] as &[(&str, &str)], Vec::new())
        .expect("start");
    assert!(matches!(inst.feed(vec![]), Err(Error::Trap(_))));
}

#[test]
fn imports_other_than_ferrys_are_refused_at_load() {
    let h = host_with(Duration::from_millis(100), 1 << 20);
    let tail = r#"(memory (export "memory") 1)
        (func (export "init") (result i32) (i32.const 0))
        (func (export "on_data") (param i32) (result i32) (i32.const 0))"#;
    let bad = [
        r#"(import "env" "open" (func (param i32) (result i32)))"#,
        r#"(import "wasi_snapshot_preview1" "fd_write" (func (param i32 i32 i32 i32) (result i32)))"#,
        r#"(import "ferry" "exec" (func (param i32) (result i32)))"#,
        r#"(import "ferry" "emit" (func (param i64) (result i32)))"#,
        r#"(import "ferry" "emit" (global i32))"#,
    ];
    for imp in bad {
        let wat = format!("(module {imp} {tail})");
        let e = h.load(wat.as_bytes()).unwrap_err();
        assert!(matches!(e, Error::BadModule(_)), "{imp}: {e}");
    }
    // Missing or mistyped exports, an imported memory, garbage.
    let bad_modules = [
        r#"(module (memory (export "memory") 1) (func (export "init") (result i32) (i32.const 0)))"#,
        r#"(module (func (export "init") (result i32) (i32.const 0)) (func (export "on_data") (param i32) (result i32) (i32.const 0)))"#,
        r#"(module (memory (export "memory") 1) (func (export "init") (result i64) (i64.const 0)) (func (export "on_data") (param i32) (result i32) (i32.const 0)))"#,
        r#"(module (import "ferry" "memory" (memory 1)) (func (export "init") (result i32) (i32.const 0)) (func (export "on_data") (param i32) (result i32) (i32.const 0)))"#,
        "not a module",
    ];
    for m in bad_modules {
        assert!(
            matches!(h.load(m.as_bytes()), Err(Error::BadModule(_))),
            "{m}"
        );
    }
    assert!(matches!(
        h.load(b"\0asm\x01\0\0\0garbage"),
        Err(Error::BadModule(_))
    ));
}

#[test]
fn module_failure_status_stops_the_instance() {
    let h = host_with(Duration::from_millis(100), 1 << 20);
    let id = h.load(module("(i32.const -7)").as_bytes()).expect("load");
    let (mut inst, _) = h
        .start(id, &[] as &[(&str, &str)], Vec::new())
        .expect("start");
    assert!(matches!(inst.feed(vec![]), Err(Error::ModuleFailed(-7))));
    assert!(matches!(inst.feed(vec![]), Err(Error::Stopped)));
}

#[test]
fn pool_exhaustion_is_an_error_and_slots_come_back() {
    let h = ModuleHost::new(Limits {
        max_instances: 2,
        ..Limits::default()
    })
    .expect("host");
    let id = h.load(module("(i32.const 0)").as_bytes()).expect("load");
    let none: &[(&str, &str)] = &[];
    let a = h.start(id, none, Vec::new()).expect("1st");
    let b = h.start(id, none, Vec::new()).expect("2nd");
    assert!(matches!(
        h.start(id, none, Vec::new()),
        Err(Error::NoCapacity(2))
    ));
    drop(a);
    let _c = h.start(id, none, Vec::new()).expect("slot back after drop");
    drop(b);
    assert!(matches!(
        h.start(ferry_modules::ModuleId(99), none, Vec::new()),
        Err(Error::UnknownModule(99))
    ));
}

/// While one instance loops (until its deadline), another instance keeps serving real
/// clients on other sockets.
#[test]
fn other_sockets_are_served_while_one_module_loops() {
    let deadline = Duration::from_secs(3);
    let h = Arc::new(host_with(deadline, 4 << 20));
    let looping = h.load(module(LOOP).as_bytes()).expect("load loop");
    let http = h.load(&example("http_file")).expect("load http_file");
    let dir = tmpdir("isolation-serve");
    let path = dir.join("page");
    let data = random_bytes(2322, 9);
    std::fs::write(&path, &data).expect("write");

    let go = Arc::new(Barrier::new(2));
    let (h2, go2) = (Arc::clone(&h), Arc::clone(&go));
    let looper = thread::spawn(move || {
        let (mut inst, _) = h2
            .start(looping, &[] as &[(&str, &str)], Vec::new())
            .expect("start");
        go2.wait();
        let t = Instant::now();
        let r = inst.feed(vec![0]);
        (r, t.elapsed())
    });
    go.wait();
    let t = Instant::now();
    let mut served = 0;
    while served < 10 {
        let (h3, p) = (Arc::clone(&h), path.clone());
        let (url, server) = serve_once(move |s| {
            let f = std::fs::File::open(&p).expect("open");
            let (_i, actions) = h3
                .start(http, &[("content-length", "2322")], vec![f.into()])
                .expect("start");
            perform(actions, s).expect("perform");
        });
        let (_, body, _) = curl(&dir, &url, &[]);
        server.join().expect("server");
        assert!(body == data);
        served += 1;
    }
    let serving = t.elapsed();
    let (r, looped) = looper.join().expect("looper");
    assert!(matches!(r, Err(Error::Deadline(_))), "{r:?}");
    assert!(
        serving < looped,
        "10 responses took {serving:?}, the loop ran {looped:?}: they should finish first"
    );
}
