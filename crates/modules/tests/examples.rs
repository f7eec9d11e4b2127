//! The shipped example modules serving a real client (curl) over TCP on 127.0.0.1.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use common::{curl, example, host, random_bytes, serve_once, text_bytes, tmpdir};
use ferry_modules::{Action, ModuleHost, perform};

/// http_file: header + file through sendfile; the file never enters wasm memory.
#[test]
fn http_file_serves_a_file_to_curl() {
    let dir = tmpdir("http-file");
    for (i, size) in [0usize, 2322, 1 << 20, 3 * (1 << 20) + 17]
        .into_iter()
        .enumerate()
    {
        let data = random_bytes(size, 42 + i as u64);
        let path = dir.join(format!("file{i}"));
        std::fs::write(&path, &data).expect("write file");

        let h = host();
        let id = h.load(&example("http_file")).expect("load http_file");
        let (url, server) = serve_once(move |s| {
            let f = std::fs::File::open(&path).expect("open");
            let len = f.metadata().expect("stat").len().to_string();
            let props = [
                ("content-length", len.as_str()),
                ("content-type", "application/x-test"),
            ];
            let (inst, actions) = h.start(id, &props, vec![f.into()]).expect("start");
            assert!(inst.is_finished(), "http_file finishes in init");
            // The header as bytes, the body by reference only.
            assert!(matches!(&actions[0], Action::Emit(_)));
            if size > 0 {
                assert!(
                    matches!(&actions[1], Action::EmitFile { offset: 0, len, .. } if *len == size as u64)
                );
            }
            assert!(
                inst.held_bytes() < 4096,
                "no file bytes held by the instance"
            );
            let n = perform(actions, s).expect("perform");
            assert!(n >= size as u64);
        });
        let (headers, body, _) = curl(&dir, &url, &[]);
        server.join().expect("server thread");
        assert!(headers.starts_with("HTTP/1.1 200 OK\r\n"), "{headers}");
        assert!(
            headers.contains(&format!("Content-Length: {size}\r\n")),
            "{headers}"
        );
        assert!(
            headers.contains("Content-Type: application/x-test\r\n"),
            "{headers}"
        );
        assert_eq!(body.len(), data.len());
        assert!(body == data, "body differs from the file ({size} bytes)");
    }
}

#[test]
fn http_file_refuses_a_range_beyond_the_file() {
    let dir = tmpdir("http-file-range");
    let path = dir.join("f");
    std::fs::write(&path, b"short").expect("write");
    let h = host();
    let id = h.load(&example("http_file")).expect("load");
    let f = std::fs::File::open(&path).expect("open");
    let e = h
        .start(id, &[("content-length", "100")], vec![f.into()])
        .unwrap_err();
    assert!(
        matches!(
            e,
            ferry_modules::Error::ModuleFailed(ferry_modules::abi::ERR_RANGE)
        ),
        "{e}"
    );
    let f = std::fs::File::open(&path).expect("open");
    let e = h
        .start(id, &[("content-length", "12x")], vec![f.into()])
        .unwrap_err();
    assert!(matches!(e, ferry_modules::Error::ModuleFailed(-1)), "{e}");
}

/// Runs the gzip module over `input` fed in pieces of `piece` bytes; returns the stream.
/// http_file's `lines` mode: init sends nothing, each newline fed (however the lines
/// are split across buffers) gets header + file, and a bad mode fails init.
#[test]
fn http_file_lines_mode_answers_each_line() {
    let dir = tmpdir("http-file-lines");
    let path = dir.join("f");
    std::fs::write(&path, b"0123456789").expect("write");
    let h = host();
    let id = h.load(&example("http_file")).expect("load");
    let open = || std::fs::File::open(&path).expect("open").into();
    let props = [("content-length", "10"), ("mode", "lines")];
    let (mut inst, actions) = h.start(id, &props, vec![open()]).expect("start");
    assert!(actions.is_empty(), "nothing before the first line");
    assert!(!inst.is_finished());
    let responses = |actions: &[Action]| {
        assert_eq!(actions.len() % 2, 0);
        for pair in actions.chunks(2) {
            let Action::Emit(head) = &pair[0] else {
                panic!("header first: {pair:?}")
            };
            assert!(head.starts_with(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n"));
            assert!(matches!(
                pair[1],
                Action::EmitFile {
                    offset: 0,
                    len: 10,
                    ..
                }
            ));
        }
        actions.len() / 2
    };
    assert_eq!(
        responses(&inst.feed(b"GET\nGET".to_vec()).expect("feed")),
        1
    );
    assert_eq!(responses(&inst.feed(b"\n".to_vec()).expect("feed")), 1);
    assert_eq!(responses(&inst.feed(Vec::new()).expect("feed")), 0);
    // More lines than one scan of the module's memory (1 KiB) holds.
    let many = "x\n".repeat(700).into_bytes();
    assert_eq!(responses(&inst.feed(many).expect("feed")), 700);
    assert!(inst.close().expect("close").is_empty());
    // "once" is the default spelled out; anything else is refused.
    let (inst, actions) = h
        .start(
            id,
            &[("content-length", "10"), ("mode", "once")],
            vec![open()],
        )
        .expect("start once");
    assert!(inst.is_finished() && responses(&actions) == 1);
    for bad in ["line", "linesx", "ONCE", ""] {
        let e = h
            .start(id, &[("content-length", "10"), ("mode", bad)], vec![open()])
            .unwrap_err();
        assert!(
            matches!(e, ferry_modules::Error::ModuleFailed(-1)),
            "{bad}: {e}"
        );
    }
}

fn gzip_stream(h: &ModuleHost, input: &[u8], piece: usize, props: &[(&str, &str)]) -> Vec<u8> {
    let id = h.load(&example("gzip")).expect("load gzip");
    let (mut inst, mut actions) = h.start(id, props, Vec::new()).expect("start");
    for chunk in input.chunks(piece.max(1)) {
        actions.extend(inst.feed(chunk.to_vec()).expect("feed"));
    }
    actions.extend(inst.close().expect("close"));
    let mut out = Vec::new();
    for a in actions {
        match a {
            Action::Emit(b) => out.extend_from_slice(&b),
            Action::EmitFile { .. } => panic!("gzip emits no files"),
        }
    }
    out
}

fn gunzip(stream: &[u8]) -> Vec<u8> {
    let mut child = Command::new("gzip")
        .args(["-d", "-c"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run gzip");
    let mut stdin = child.stdin.take().expect("stdin");
    let data = stream.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&data);
    });
    let out = child.wait_with_output().expect("gzip output");
    writer.join().expect("writer");
    assert!(
        out.status.success(),
        "gzip -d: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// The stream is a real gzip stream (gzip -d accepts it, CRC and length included) and
/// it compresses.
#[test]
fn gzip_output_is_accepted_by_gzip() {
    let h = host();
    let cases: Vec<(&str, Vec<u8>, usize)> = vec![
        ("empty", Vec::new(), 1),
        ("one byte", b"x".to_vec(), 1),
        ("three", b"abc".to_vec(), 1),
        ("runs", vec![b'a'; 100_000], 4096),
        ("runs in 1-byte pieces", vec![b'z'; 3000], 1),
        ("text in 7-byte pieces", text_bytes(20_000, 3), 7),
        ("text in 32 KiB pieces", text_bytes(300_000, 4), 32 * 1024),
        ("text in 100 KiB pieces", text_bytes(1 << 20, 5), 100 * 1024),
        ("random", random_bytes(200_000, 6), 65536),
        (
            "all byte values",
            (0..=255u8).cycle().take(70_000).collect(),
            9999,
        ),
    ];
    for (name, input, piece) in cases {
        let z = gzip_stream(&h, &input, piece, &[]);
        assert_eq!(&z[..3], &[0x1f, 0x8b, 8], "{name}: gzip magic");
        let back = gunzip(&z);
        assert!(
            back == input,
            "{name}: round trip differs ({} vs {} bytes)",
            back.len(),
            input.len()
        );
        if name.starts_with("text") {
            assert!(
                z.len() * 2 < input.len(),
                "{name}: {} -> {} bytes: not compressing",
                input.len(),
                z.len()
            );
        }
        if name == "runs" {
            assert!(z.len() < 2000, "runs: {} bytes", z.len());
        }
    }
}

/// gzip as HTTP Content-Encoding: `curl --compressed` decodes it to the original.
#[test]
fn gzip_serves_compressed_content_to_curl() {
    let dir = tmpdir("gzip-curl");
    let input = text_bytes(600_000, 11);
    let h = host();
    let id = h.load(&example("gzip")).expect("load gzip");
    let data = input.clone();
    let (url, server) = serve_once(move |s| {
        let (mut inst, actions) = h
            .start(
                id,
                &[("http", "1"), ("content-type", "text/plain")],
                Vec::new(),
            )
            .expect("start");
        perform(actions, s).expect("perform header");
        for chunk in data.chunks(64 * 1024) {
            let actions = inst.feed(chunk.to_vec()).expect("feed");
            perform(actions, s).expect("perform");
        }
        perform(inst.close().expect("close"), s).expect("perform close");
    });
    let (headers, body, _) = curl(&dir, &url, &["--compressed"]);
    server.join().expect("server");
    assert!(headers.contains("Content-Encoding: gzip\r\n"), "{headers}");
    assert!(
        body == input,
        "decoded body differs ({} vs {} bytes)",
        body.len(),
        input.len()
    );

    // The same without decoding: the wire carries fewer bytes than the text.
    let h = host();
    let id = h.load(&example("gzip")).expect("load gzip");
    let data = input.clone();
    let (url, server) = serve_once(move |s| {
        let (mut inst, mut actions) = h.start(id, &[("http", "1")], Vec::new()).expect("start");
        for chunk in data.chunks(64 * 1024) {
            actions.extend(inst.feed(chunk.to_vec()).expect("feed"));
        }
        actions.extend(inst.close().expect("close"));
        perform(actions, s).expect("perform");
    });
    let (_, raw, _) = curl(&dir, &url, &[]);
    server.join().expect("server");
    assert!(
        raw.len() * 3 < input.len(),
        "wire {} bytes for {} of text",
        raw.len(),
        input.len()
    );
    assert!(gunzip(&raw) == input);
}

fn expand(template: &str, props: &[(&str, &str)]) -> String {
    let mut out = template.to_string();
    for (k, v) in props {
        out = out.replace(&format!("{{{{{k}}}}}"), v);
    }
    out
}

/// template: `{{name}}` replaced by properties, chunked HTTP, placeholders split across
/// input buffers.
#[test]
fn template_serves_transformed_content_to_curl() {
    let dir = tmpdir("template-curl");
    let template = "<html><title>{{title}}</title>\n<p>Hello, {{name}}! {{missing}} stays; \
                    { single } and {{ spaced }} too; {{}} empty; {{name}}{{name}}.</p>\n"
        .repeat(500);
    let props = [
        ("http", "1"),
        ("content-type", "text/html"),
        ("title", "ferry modules"),
        ("name", "S3"),
    ];
    let expected = expand(&template, &props);
    for piece in [1usize, 5, 4096, 1 << 20] {
        let h = host();
        let id = h.load(&example("template")).expect("load template");
        let t = template.clone().into_bytes();
        let (url, server) = serve_once(move |s| {
            let (mut inst, actions) = h.start(id, &props, Vec::new()).expect("start");
            perform(actions, s).expect("perform header");
            let mut batch = Vec::new();
            for chunk in t.chunks(piece) {
                batch.extend(inst.feed(chunk.to_vec()).expect("feed"));
                if batch.len() > 64 {
                    perform(std::mem::take(&mut batch), s).expect("perform");
                }
            }
            batch.extend(inst.close().expect("close"));
            perform(batch, s).expect("perform");
        });
        let (headers, body, _) = curl(&dir, &url, &[]);
        server.join().expect("server");
        assert!(
            headers.contains("Transfer-Encoding: chunked\r\n"),
            "{headers}"
        );
        assert!(headers.contains("Content-Type: text/html\r\n"), "{headers}");
        let body = String::from_utf8(body).expect("utf8");
        assert_eq!(body.len(), expected.len(), "piece {piece}");
        assert!(body == expected, "piece {piece}: body differs");
    }
}

/// template without http: a pure transform; edge cases at the end of the input.
#[test]
fn template_edge_cases() {
    let h = host();
    let id = h.load(&example("template")).expect("load");
    let long = "x".repeat(100);
    let big = "v".repeat(30_000);
    let huge = "w".repeat(100_000);
    let cases = [
        ("plain", "plain".to_string()),
        ("{{a}}", "A".to_string()),
        ("x{{a", "x{{a".to_string()),
        ("x{", "x{".to_string()),
        ("x{{a}", "x{{a}".to_string()),
        ("{{a}x}}", "{{a}x}}".to_string()),
        // The name read is `{a`, which is no property: left as it is.
        ("{{{a}}}", "{{{a}}}".to_string()),
        ("{{big}}", big.clone()),
        // Values are cut at 32 KiB (documented).
        ("{{huge}}", "w".repeat(32 * 1024)),
        (&*format!("{{{{{long}}}}}"), format!("{{{{{long}}}}}")),
    ];
    for (input, want) in cases {
        let props = [("a", "A"), ("big", big.as_str()), ("huge", huge.as_str())];
        let (mut inst, mut actions) = h.start(id, &props, Vec::new()).expect("start");
        for b in input.as_bytes().chunks(3) {
            actions.extend(inst.feed(b.to_vec()).expect("feed"));
        }
        actions.extend(inst.close().expect("close"));
        let mut out = Vec::new();
        for a in actions {
            if let Action::Emit(b) = a {
                out.extend(b);
            }
        }
        let got = String::from_utf8(out).expect("utf8");
        assert_eq!(got.len(), want.len(), "input {input:?}");
        assert!(
            got == want,
            "input {input:?}: got {:?}",
            &got[..got.len().min(80)]
        );
    }
}
