//! A VM guest under QEMU, as E8 and `ferry demo --vm` boot it: the kernel and initramfs
//! scripts/guest-image.sh builds (its init configures eth0 from the kernel command line,
//! runs a shell script given there in base64, prints `FERRY-GUEST-READY`, the script's
//! output and `FERRY-GUEST-EXIT <status>` on the serial console, and powers off), the
//! accelerator (KVM where a guest really boots, TCG otherwise: a `/dev/kvm` whose
//! vCPUs hang is common in nested VMs), and the guest's network device: a vhost-user
//! socket (ferry vm, passt), QEMU's user-mode stack (libslirp) or a TAP (with the
//! kernel's vhost-net or without).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// The QEMU binary.
pub const QEMU: &str = "qemu-system-x86_64";

/// The kernel's command line limit on x86 (`COMMAND_LINE_SIZE`).
const CMDLINE_MAX: usize = 2048;

/// Why a guest could not be prepared or run.
#[derive(Debug, thiserror::Error)]
pub enum GuestError {
    /// QEMU is not installed.
    #[error("{QEMU} not found (scripts/install-deps.sh installs qemu-system-x86)")]
    NoQemu,
    /// The image script failed or is missing.
    #[error("the guest image could not be built by {script}: {why}")]
    Image {
        /// The script.
        script: String,
        /// What it said.
        why: String,
    },
    /// The script would not fit on the kernel command line.
    #[error("the guest's script makes a kernel command line of {0} bytes (at most {CMDLINE_MAX})")]
    TooLong(usize),
}

/// The guest's kernel and initramfs.
#[derive(Clone, Debug)]
pub struct Image {
    /// vmlinuz.
    pub kernel: PathBuf,
    /// initrd.img.
    pub initrd: PathBuf,
}

impl Image {
    /// The image script of the source tree this binary was built from.
    pub fn script() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/guest-image.sh")
    }

    /// Where images are kept by default: `guest/` in the target directory of the
    /// running binary (target/release/ferry → target/guest).
    pub fn default_dir() -> Option<PathBuf> {
        let exe = std::env::current_exe().ok()?;
        Some(exe.parent()?.parent()?.join("guest"))
    }

    /// The image in `dir`, built (or reused: the script keeps it while it is current)
    /// by `script`.
    pub fn build(script: &Path, dir: &Path) -> Result<Image, GuestError> {
        let fail = |why: String| GuestError::Image {
            script: script.display().to_string(),
            why,
        };
        if !script.is_file() {
            return Err(fail("no such script".into()));
        }
        let o = Command::new("bash")
            .arg(script)
            .arg(dir)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| fail(e.to_string()))?;
        if !o.status.success() {
            let err = String::from_utf8_lossy(&o.stderr);
            return Err(fail(err.lines().last().unwrap_or("").to_owned()));
        }
        Ok(Image::existing(dir))
    }

    /// The image files in `dir`, without building them.
    pub fn existing(dir: &Path) -> Image {
        Image {
            kernel: dir.join("vmlinuz"),
            initrd: dir.join("initrd.img"),
        }
    }

    /// Whether both files are there.
    pub fn present(&self) -> bool {
        self.kernel.is_file() && self.initrd.is_file()
    }
}

/// QEMU's accelerator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accel {
    /// Hardware virtualization.
    Kvm,
    /// QEMU's own code translation (the guest's CPU is emulated: slow, everywhere).
    Tcg,
}

impl Accel {
    /// `kvm` or `tcg`.
    pub fn name(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }

    /// Parses [`Accel::name`].
    pub fn parse(s: &str) -> Option<Accel> {
        match s {
            "kvm" => Some(Accel::Kvm),
            "tcg" => Some(Accel::Tcg),
            _ => None,
        }
    }

    /// KVM when `/dev/kvm` exists and a guest really boots under it within `limit`
    /// (powers off after running `true`), TCG otherwise; with why KVM was not taken.
    pub fn detect(image: &Image, limit: Duration) -> (Accel, String) {
        if !Path::new("/dev/kvm").exists() {
            return (Accel::Tcg, "no /dev/kvm".into());
        }
        let g = Guest {
            accel: Accel::Kvm,
            image: image.clone(),
            net: Net::None,
            addr: None,
            mtu: None,
            script: "true".into(),
            mem_mb: 128,
            smp: 1,
        };
        let Ok(mut cmd) = g.command() else {
            return (Accel::Tcg, "cannot build the probe's command".into());
        };
        cmd.stdout(Stdio::piped()).stderr(Stdio::null());
        let out = crate::exec::run(&mut cmd, limit, &crate::exec::Interrupt::new());
        match out {
            Ok(o) if said(&o.stdout, "FERRY-GUEST-EXIT").is_some() => {
                (Accel::Kvm, "a guest booted under KVM".into())
            }
            Ok(o) if o.timed_out => (
                Accel::Tcg,
                format!(
                    "/dev/kvm exists but a guest did not boot under it in {} s (nested virtualization without the CPU's extensions hangs vCPUs)",
                    limit.as_secs()
                ),
            ),
            Ok(o) => (Accel::Tcg, format!("KVM probe failed: {}", o.failure())),
            Err(e) => (Accel::Tcg, format!("KVM probe failed: {e}")),
        }
    }
}

/// The guest's network device.
#[derive(Clone, Debug)]
pub enum Net {
    /// None (the KVM probe).
    None,
    /// virtio-net on a vhost-user backend at this socket, with queue pairs.
    VhostUser {
        /// The backend's socket.
        socket: PathBuf,
        /// Queue pairs (multi-queue when above 1).
        queues: u16,
    },
    /// QEMU's user-mode stack (libslirp): guest 10.0.2.15/24, gateway 10.0.2.2.
    User,
    /// A TAP device opened by name; `vhost`: the kernel's vhost-net moves its frames.
    Tap {
        /// The TAP's name (in QEMU's network namespace).
        ifname: String,
        /// vhost=on.
        vhost: bool,
    },
}

/// One guest to boot.
#[derive(Clone, Debug)]
pub struct Guest {
    /// The accelerator.
    pub accel: Accel,
    /// Kernel and initramfs.
    pub image: Image,
    /// The network device.
    pub net: Net,
    /// eth0's address (`ADDR/PREFIX`) and default gateway.
    pub addr: Option<(String, String)>,
    /// eth0's MTU.
    pub mtu: Option<u32>,
    /// The shell script the guest runs (busybox sh).
    pub script: String,
    /// Memory, MiB.
    pub mem_mb: u32,
    /// vCPUs.
    pub smp: u32,
}

impl Guest {
    /// The QEMU command line (the serial console on stdout, stdin from /dev/null).
    pub fn command(&self) -> Result<Command, GuestError> {
        let append = cmdline(self.addr.as_ref(), self.mtu, &self.script)?;
        let mut c = Command::new(QEMU);
        match self.accel {
            Accel::Kvm => c.args(["-accel", "kvm", "-cpu", "host"]),
            Accel::Tcg => c.args(["-accel", "tcg"]),
        };
        let (mem, smp) = (self.mem_mb.to_string(), self.smp.to_string());
        c.args(["-smp", &smp, "-m", &mem, "-nodefaults", "-no-reboot"])
            .args(["-display", "none", "-serial", "stdio"]);
        self.net_args(&mut c, &mem);
        c.arg("-kernel")
            .arg(&self.image.kernel)
            .arg("-initrd")
            .arg(&self.image.initrd)
            .arg("-append")
            .arg(append)
            .stdin(Stdio::null());
        Ok(c)
    }

    fn net_args(&self, c: &mut Command, mem: &str) {
        match &self.net {
            Net::None => {}
            Net::VhostUser { socket, queues } => {
                // vhost-user maps the guest's memory: it must be shared.
                c.arg("-object")
                    .arg(format!("memory-backend-memfd,id=mem,size={mem}M,share=on"))
                    .args(["-numa", "node,memdev=mem"])
                    .arg("-chardev")
                    .arg(format!("socket,id=c0,path={}", socket.display()))
                    .arg("-netdev")
                    .arg(format!("vhost-user,id=n0,chardev=c0,queues={queues}"));
                if *queues > 1 {
                    let vectors = 2 * u32::from(*queues) + 2;
                    c.arg("-device")
                        .arg(format!("virtio-net-pci,netdev=n0,mq=on,vectors={vectors}"));
                } else {
                    c.args(["-device", "virtio-net-pci,netdev=n0"]);
                }
            }
            Net::User => {
                c.args([
                    "-netdev",
                    "user,id=n0",
                    "-device",
                    "virtio-net-pci,netdev=n0",
                ]);
            }
            Net::Tap { ifname, vhost } => {
                let v = if *vhost { "on" } else { "off" };
                c.arg("-netdev")
                    .arg(format!(
                        "tap,id=n0,ifname={ifname},script=no,downscript=no,vhost={v}"
                    ))
                    .args(["-device", "virtio-net-pci,netdev=n0"]);
            }
        }
    }
}

/// The kernel command line of a guest: the console, eth0's settings and the script.
pub fn cmdline(
    addr: Option<&(String, String)>,
    mtu: Option<u32>,
    script: &str,
) -> Result<String, GuestError> {
    let mut s = String::from("console=ttyS0 quiet");
    if let Some((ip, gw)) = addr {
        s.push_str(&format!(" ferry.ip={ip} ferry.gw={gw}"));
    }
    if let Some(m) = mtu {
        s.push_str(&format!(" ferry.mtu={m}"));
    }
    s.push_str(" ferry.run=");
    s.push_str(&base64(script.as_bytes()));
    if s.len() >= CMDLINE_MAX {
        return Err(GuestError::TooLong(s.len()));
    }
    Ok(s)
}

/// Standard base64 with padding.
pub fn base64(data: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ABC[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The value after `key ` on the console's first line that starts with `key`.
pub fn said<'a>(console: &'a str, key: &str) -> Option<&'a str> {
    console
        .lines()
        .find_map(|l| l.trim().strip_prefix(key)?.strip_prefix(' '))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_pads() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"echo hi\n"), "ZWNobyBoaQo=");
    }

    #[test]
    fn cmdline_carries_settings_and_refuses_long_scripts() {
        let a = ("10.0.2.15/24".to_owned(), "10.0.2.2".to_owned());
        let c = cmdline(Some(&a), Some(65520), "true").unwrap();
        assert_eq!(
            c,
            "console=ttyS0 quiet ferry.ip=10.0.2.15/24 ferry.gw=10.0.2.2 ferry.mtu=65520 ferry.run=dHJ1ZQ=="
        );
        let long = "x".repeat(1600);
        assert!(matches!(
            cmdline(None, None, &long),
            Err(GuestError::TooLong(_))
        ));
    }

    #[test]
    fn said_reads_the_first_line_with_the_key() {
        let c = "boot\r\nFERRY-GUEST-READY\r\n SUM 12 3\nFERRY-GUEST-EXIT 0\nSUM 9\n";
        assert_eq!(said(c, "SUM"), Some("12 3"));
        assert_eq!(said(c, "FERRY-GUEST-EXIT"), Some("0"));
        assert_eq!(said(c, "NONE"), None);
    }
}
