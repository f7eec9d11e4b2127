//! The container's network side as `create` sees it: the process it starts (`ferry oci
//! _serve`, the full ferry: `ferry run`'s servers, sandbox, TAP and DNS, in the network
//! namespace the engine gave the container), its command line ([`Serve`]) and the
//! lines it says ([`Said`]), declared here for both ends.
//!
//! The talk, one line each on its stdin and stdout: it checks the container's options
//! (each named by its source) and says "refused" or, once the sandbox's namespace
//! exists, "ready" (the holder's pid, the sandbox's directory, the shim to preload, if
//! any) → `create` writes the container's pid (the real runtime has created it) and
//! returns. "Serving" is said to `start` instead ([`Pending`], [`wait_serving`]): the
//! container runs only from `start` on, so `create` need not wait for the servers. It
//! ends when the container's first process ends, when `delete` stops it
//! ([`crate::state::stop_side`]), or when `create` gives up (its stdin closes).

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::RawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde_json::{Value, json};

use crate::cli::OciError;
use crate::options::Flag;
use crate::state::{self, NET_DIR, RECORD, Record, SERVING};

/// The network side's command (hidden: `create` starts it).
pub const SERVE: &str = "_serve";
/// Its log, in the container's state directory.
const LOG: &str = "network.log";

/// Where the network side's warnings go besides its log (`_serve`'s options).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Targets {
    /// A descriptor of the container's stderr, inherited from `create`.
    pub stderr_fd: Option<RawFd>,
    /// The runtime's `--log`, and whether it is JSON.
    pub log: Option<(PathBuf, bool)>,
}

/// `_serve`'s command line: `--id ID --netns PATH|new [--serving PATH] [--stderr-fd N]
/// [--log PATH [--log-json]] --options JSON` (the container's options, each with its
/// source).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Serve {
    /// The container's id.
    pub id: String,
    /// The engine's namespace to enter; `None`: a new one.
    pub netns: Option<PathBuf>,
    /// Where it tells `start` that it serves ([`Pending`]).
    pub serving: Option<PathBuf>,
    /// Where its warnings go.
    pub targets: Targets,
    /// The container's options.
    pub flags: Vec<Flag>,
}

impl Serve {
    /// The arguments after `_serve`.
    pub fn args(&self) -> Vec<String> {
        let netns = self
            .netns
            .as_ref()
            .map_or_else(|| "new".to_owned(), |p| p.display().to_string());
        let mut v = vec!["--id".into(), self.id.clone(), "--netns".into(), netns];
        if let Some(p) = &self.serving {
            v.extend(["--serving".into(), p.display().to_string()]);
        }
        if let Some(fd) = self.targets.stderr_fd {
            v.extend(["--stderr-fd".into(), fd.to_string()]);
        }
        if let Some((path, json)) = &self.targets.log {
            v.extend(["--log".into(), path.display().to_string()]);
            if *json {
                v.push("--log-json".into());
            }
        }
        let flags: Vec<Value> = self
            .flags
            .iter()
            .map(|f| json!([f.source, f.args]))
            .collect();
        v.extend(["--options".into(), Value::from(flags).to_string()]);
        v
    }

    /// Parses [`Serve::args`]'s.
    pub fn parse(argv: &[String]) -> Option<Serve> {
        let [i, id, n, netns, rest @ ..] = argv else {
            return None;
        };
        if i != "--id" || n != "--netns" {
            return None;
        }
        let mut s = Serve {
            id: id.clone(),
            netns: (netns != "new").then(|| netns.into()),
            serving: None,
            targets: Targets::default(),
            flags: Vec::new(),
        };
        let mut it = rest.iter();
        let mut options = None;
        while let Some(name) = it.next() {
            match name.as_str() {
                "--serving" => s.serving = Some(it.next()?.into()),
                "--stderr-fd" => s.targets.stderr_fd = Some(it.next()?.parse().ok()?),
                "--log" => s.targets.log = Some((it.next()?.into(), false)),
                "--log-json" => s.targets.log.as_mut()?.1 = true,
                "--options" => options = Some(it.next()?),
                _ => return None,
            }
        }
        let options: Value = serde_json::from_str(options?).ok()?;
        for f in options.as_array()? {
            let (source, args) = (f.get(0)?.as_str()?, f.get(1)?.as_array()?);
            let args = args.iter().map(|a| a.as_str().map(str::to_owned));
            s.flags.push(Flag {
                source: source.to_owned(),
                args: args.collect::<Option<_>>()?,
            });
        }
        Some(s)
    }
}

/// What the network side says on its stdout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Said {
    /// A refused option: where it came from, what `ferry run`'s checks said.
    Refused {
        /// The option's source ("annotation ferry.net=…").
        origin: String,
        /// Why.
        message: String,
    },
    /// The sandbox's namespace exists.
    Ready(Ready),
}

/// What "ready" says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ready {
    /// The process holding the sandbox's network namespace.
    pub holder: u32,
    /// The sandbox's directory (control socket, shim).
    pub dir: PathBuf,
    /// The shim to preload where the image can load it (`None`: the TAP alone serves
    /// the container, `--net nic`).
    pub shim: Option<PathBuf>,
}

impl Said {
    /// The line (fields separated by tabs: paths may hold spaces).
    pub fn line(&self) -> String {
        match self {
            Said::Refused { origin, message } => {
                format!("refused\t{origin}\t{}\n", message.replace('\n', " "))
            }
            Said::Ready(r) => {
                let shim = r
                    .shim
                    .as_ref()
                    .map_or("-".into(), |s| s.display().to_string());
                format!("ready\t{}\t{}\t{shim}\n", r.holder, r.dir.display())
            }
        }
    }

    /// Parses [`Said::line`]'s.
    pub fn parse(line: &str) -> Option<Said> {
        let f: Vec<&str> = line.trim_end_matches('\n').split('\t').collect();
        match f[..] {
            ["refused", origin, message] => Some(Said::Refused {
                origin: origin.into(),
                message: message.into(),
            }),
            ["ready", holder, dir, shim] => Some(Said::Ready(Ready {
                holder: holder.parse().ok()?,
                dir: dir.into(),
                shim: (shim != "-").then(|| shim.into()),
            })),
            _ => None,
        }
    }
}

/// The network side, seen from `create`: killed when dropped unless [`Side::keep`].
#[derive(Debug)]
pub struct Side {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    log: PathBuf,
    /// The sandbox's directory, once it said "ready".
    made: Option<PathBuf>,
    kept: bool,
}

impl Side {
    /// Starts the network side (`ferry oci _serve`) for the container whose state is
    /// in `dir`.
    pub fn spawn(ferry: &Path, dir: &Path, serve: &Serve) -> Result<Side, OciError> {
        let log = dir.join(LOG);
        let log_file = std::fs::File::create(&log)
            .map_err(OciError::io(format!("creating {}", log.display())))?;
        let mut child = Command::new(ferry)
            .args(["oci", SERVE])
            .args(serve.args())
            .env("NO_COLOR", "1")
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log_file)
            // Out of the engine's process group: its signals to the runtime are not ours.
            .process_group(0)
            .spawn()
            .map_err(OciError::io("starting the network side"))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            return Err(OciError::Side("no pipes".into()));
        };
        Ok(Side {
            child,
            stdin: Some(stdin),
            stdout: BufReader::new(stdout),
            log,
            made: None,
            kept: false,
        })
    }

    /// Waits for "ready" (a refused option is [`OciError::Value`]).
    pub fn ready(&mut self) -> Result<Ready, OciError> {
        match self.said()? {
            Said::Ready(r) => {
                self.made = Some(r.dir.clone());
                Ok(r)
            }
            Said::Refused { origin, message } => {
                let _ = self.child.wait();
                Err(OciError::Value { origin, message })
            }
        }
    }

    /// Writes its record and its sandbox's directory into the state directory `dir`.
    pub fn record(&self, dir: &Path, ready: &Ready) -> Result<(), OciError> {
        let pid = self.child.id();
        let start = state::start_time(pid).ok_or_else(|| OciError::Side("it exited".into()))?;
        let write = |name: &str, text: String| {
            let path = dir.join(name);
            std::fs::write(&path, text).map_err(OciError::io(format!("writing {}", path.display())))
        };
        write(RECORD, Record { pid, start }.encode())?;
        write(NET_DIR, ready.dir.display().to_string())
    }

    /// The pid the hooks see: the network side's.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Tells it the container's pid (it then serves; `start` waits for that).
    pub fn container(&mut self, pid: u32) -> Result<(), OciError> {
        if let Some(mut stdin) = self.stdin.take() {
            writeln!(stdin, "{pid}").map_err(|_| self.failed())?;
        }
        Ok(())
    }

    /// Leaves it running (the container is created).
    pub fn keep(mut self) {
        self.kept = true;
    }

    fn said(&mut self) -> Result<Said, OciError> {
        let mut line = String::new();
        match self.stdout.read_line(&mut line) {
            Ok(n) if n > 0 => Said::parse(&line).ok_or_else(|| self.failed()),
            _ => Err(self.failed()),
        }
    }

    /// The error for a network side that did not say what it should: its log's end.
    fn failed(&mut self) -> OciError {
        let _ = self.child.kill();
        let _ = self.child.wait();
        log_tail(&self.log)
    }
}

/// [`OciError::Side`] with the end of the network side's log `log`.
fn log_tail(log: &Path) -> OciError {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let tail: Vec<&str> = text.lines().rev().take(5).collect();
    let said: Vec<&str> = tail.into_iter().rev().collect();
    OciError::Side(if said.is_empty() {
        "it exited without a word".into()
    } else {
        said.join("; ")
    })
}

/// The network side's word to `start`: an exclusive lock on the container's
/// [`SERVING`] file, taken before "ready" (so before `create` returns) and released
/// with "serving" written once it serves; if it ends before, the kernel releases the
/// lock on an empty file.
#[derive(Debug)]
pub struct Pending(std::fs::File);

impl Pending {
    /// Makes the empty file at `path` and locks it (close-on-exec: no program it
    /// starts holds the lock).
    pub fn take(path: &Path) -> std::io::Result<Pending> {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        f.lock()?;
        Ok(Pending(f))
    }

    /// It serves: "serving" written, the lock released.
    pub fn serving(self) {
        let _ = (&self.0).write_all(b"serving\n");
        let _ = self.0.unlock();
    }
}

/// `start`'s wait: returns once the network side of the container whose state is in
/// `dir` serves; its log's end if it ended first. A container without the file (not
/// ferry's, or created by an older `create`, which waited itself) passes at once.
pub fn wait_serving(dir: &Path) -> Result<(), OciError> {
    let path = dir.join(SERVING);
    let mut f = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(OciError::io(format!("opening {}", path.display()))(e)),
    };
    f.lock_shared()
        .map_err(OciError::io(format!("locking {}", path.display())))?;
    let mut said = String::new();
    let _ = f.read_to_string(&mut said);
    if said == "serving\n" {
        Ok(())
    } else {
        Err(log_tail(&dir.join(LOG)))
    }
}

impl Drop for Side {
    /// Not kept (`create` failed): killed, and the directories it made removed (a
    /// killed process removes nothing).
    fn drop(&mut self) {
        if !self.kept {
            let _ = self.child.kill();
            let _ = self.child.wait();
            let made = self.made.as_deref().and_then(state::net_dirs);
            for d in made.into_iter().flatten() {
                state::remove(&d);
            }
        }
    }
}

/// The network side's end of the talk: says `said` on stdout; false if `create` is gone.
pub fn say(said: &Said) -> bool {
    let mut out = std::io::stdout().lock();
    out.write_all(said.line().as_bytes())
        .and_then(|()| out.flush())
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serve_args_round_trip() {
        let s = Serve {
            id: "c1".into(),
            netns: Some("/run/netns/a b".into()),
            serving: Some("/s/network.serving".into()),
            targets: Targets {
                stderr_fd: Some(7),
                log: Some(("/l.json".into(), true)),
            },
            flags: vec![Flag {
                source: "annotation ferry.deny=10.0.0.0/8".into(),
                args: vec!["--deny".into(), "10.0.0.0/8".into()],
            }],
        };
        assert_eq!(Serve::parse(&s.args()), Some(s.clone()));
        let bare = Serve {
            netns: None,
            serving: None,
            targets: Targets::default(),
            flags: Vec::new(),
            ..s
        };
        let args = bare.args();
        assert_eq!(args[3], "new");
        assert_eq!(Serve::parse(&args), Some(bare));
        let v = |s: &str| s.split(' ').map(String::from).collect::<Vec<_>>();
        for bad in [
            "--id c1 --netns new",
            "--id c1 --netns new --options [[1]]",
            "--id c1 --netns new --log-json --options []",
            "--id c1 --netns new --what x --options []",
            "--netns new --id c1 --options []",
        ] {
            assert_eq!(Serve::parse(&v(bad)), None, "{bad}");
        }
    }

    #[test]
    fn start_waits_for_the_word() {
        let dir = std::env::temp_dir().join(format!("ferry-oci-pending-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // No word: not ferry's container, or an older create's.
        assert!(wait_serving(&dir).is_ok());
        // Held until it serves.
        let pending = Pending::take(&dir.join(SERVING)).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let d = dir.clone();
        let waiter = std::thread::spawn(move || tx.send(wait_serving(&d).is_ok()).unwrap());
        let early = rx.recv_timeout(std::time::Duration::from_millis(100));
        assert!(early.is_err(), "start went on before the word");
        pending.serving();
        assert_eq!(rx.recv_timeout(std::time::Duration::from_secs(5)), Ok(true));
        waiter.join().unwrap();
        // Gone before serving: the log's end.
        std::fs::write(dir.join(LOG), "ferry oci: the TAP failed\n").unwrap();
        std::fs::remove_file(dir.join(SERVING)).unwrap();
        drop(Pending::take(&dir.join(SERVING)).unwrap());
        match wait_serving(&dir) {
            Err(OciError::Side(m)) => assert!(m.contains("the TAP failed"), "{m}"),
            other => panic!("{other:?}"),
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn lines_round_trip() {
        for said in [
            Said::Refused {
                origin: "preset ferry.net=x".into(),
                message: "invalid value 'x'".into(),
            },
            Said::Ready(Ready {
                holder: 42,
                dir: "/run/ferry-oci/net/ferry-1-2.sandbox".into(),
                shim: Some("/opt/my ferry/libferry_preload.so".into()),
            }),
            Said::Ready(Ready {
                holder: 42,
                dir: "/d".into(),
                shim: None,
            }),
        ] {
            assert_eq!(Said::parse(&said.line()), Some(said.clone()));
        }
        assert_eq!(Said::parse("ready 1 /d\n"), None);
        assert_eq!(Said::parse("hello\n"), None);
    }
}
