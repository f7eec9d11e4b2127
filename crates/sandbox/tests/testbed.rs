//! The veth "remote host". Root only; each test prints a skip message otherwise.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use ferry_sandbox::testbed::{Remote, free_subnet, is_root};

fn root(test: &str) -> bool {
    let ok = is_root() && (Path::new("/usr/sbin/ip").exists() || Path::new("/sbin/ip").exists());
    if !ok {
        eprintln!("skipping {test}: needs root and iproute2");
    }
    ok
}

fn ns_name(tag: &str) -> String {
    format!("ferry-t{}-{tag}", std::process::id())
}

/// Echo one line from host to a listener that lives in the remote namespace.
fn echo_across(remote: &Remote, host_ip: Ipv4Addr, remote_ip: Ipv4Addr) {
    let listener = remote
        .run_in(|| TcpListener::bind((remote_ip, 0)))
        .unwrap()
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (mut conn, peer) = listener.accept().unwrap();
        let mut line = [0u8; 5];
        conn.read_exact(&mut line).unwrap();
        conn.write_all(&line).unwrap();
        peer
    });
    let mut conn =
        TcpStream::connect_timeout(&SocketAddr::from((remote_ip, port)), Duration::from_secs(5))
            .unwrap();
    conn.write_all(b"ping\n").unwrap();
    let mut back = [0u8; 5];
    conn.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"ping\n");
    // The connection came over this path: its source is the host side of it.
    assert_eq!(server.join().unwrap().ip(), host_ip);
}

#[test]
fn remote_is_reachable_and_cleaned_up() {
    if !root("remote_is_reachable_and_cleaned_up") {
        return;
    }
    let (host_ip, remote_ip) = free_subnet().unwrap();
    let name = ns_name("a");
    let remote = Remote::create(&name, host_ip, remote_ip, 30).unwrap();
    assert!(
        Remote::create(&name, host_ip, remote_ip, 30).is_err(),
        "duplicate name"
    );
    echo_across(&remote, host_ip, remote_ip);

    // A spawned process sees the remote's interfaces: lo and its veth end, no others.
    let out = remote
        .spawn(
            Command::new("cat")
                .arg("/proc/net/dev")
                .stdout(Stdio::piped()),
        )
        .unwrap()
        .wait_with_output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let mut names: Vec<_> = text
        .lines()
        .filter_map(|l| l.split_once(':'))
        .filter(|(n, _)| !n.contains('|'))
        .map(|(n, _)| n.trim().to_owned())
        .collect();
    names.sort();
    let mut want = vec!["lo".to_owned(), remote.paths()[0].remote_if.clone()];
    want.sort();
    assert_eq!(names, want, "{text}");

    // `ip netns exec` remounts /sys: the veth end is up there.
    let remote_if = remote.paths()[0].remote_if.clone();
    let out = remote
        .command("cat")
        .arg(format!("/sys/class/net/{remote_if}/operstate"))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "up");

    let host_if = remote.paths()[0].host_if.clone();
    drop(remote);
    assert!(!Path::new(&format!("/run/netns/{name}")).exists());
    assert!(!Path::new(&format!("/sys/class/net/{host_if}")).exists());
}

#[test]
fn second_path_is_a_separate_route() {
    if !root("second_path_is_a_separate_route") {
        return;
    }
    let (h1, r1) = free_subnet().unwrap();
    let (h2, r2) = free_subnet().unwrap();
    assert_ne!(h1, h2);
    let mut remote = Remote::create(&ns_name("b"), h1, r1, 30).unwrap();
    let second = remote.add_path(h2, r2).unwrap().clone();
    assert_eq!(remote.paths().len(), 2);
    assert_ne!(second.host_if, remote.paths()[0].host_if);
    echo_across(&remote, h1, r1);
    echo_across(&remote, h2, r2);
}
