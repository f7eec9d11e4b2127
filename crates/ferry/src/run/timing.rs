//! `FERRY_TIMING=1`: how long each of `ferry run`'s steps took, printed on stderr when
//! ferry exits, so that start-up can be taken apart by stage (docs/DESIGN.md, "Start-up").
//! Off (the default) it records nothing.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// When `main` began: the first row is measured from here.
static STARTED: OnceLock<Instant> = OnceLock::new();

/// Notes the time `ferry` began (first thing in `main`).
pub fn started() {
    let _ = STARTED.set(Instant::now());
}

/// The steps' durations, in order, when `FERRY_TIMING` is set to anything but `0`.
#[derive(Debug)]
pub struct Stages {
    /// The end of the last step (`None`: timing is off).
    last: Option<Instant>,
    rows: Vec<(&'static str, Duration)>,
}

impl Stages {
    /// On when `FERRY_TIMING` is set and not `0`.
    pub fn from_env() -> Stages {
        let on = std::env::var_os("FERRY_TIMING").is_some_and(|v| v != "0");
        Stages {
            last: on.then(|| STARTED.get().copied().unwrap_or_else(Instant::now)),
            rows: Vec::new(),
        }
    }

    /// The step `name` has just ended.
    pub fn mark(&mut self, name: &'static str) {
        if let Some(last) = self.last {
            let now = Instant::now();
            self.rows.push((name, now - last));
            self.last = Some(now);
        }
    }

    /// Prints the rows and their total on stderr (nothing when off).
    pub fn print(&self) {
        if self.last.is_some() {
            eprint!("{}", self.table());
        }
    }

    /// `ferry: timing: NAME MS` a line, then the total.
    fn table(&self) -> String {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let total: Duration = self.rows.iter().map(|(_, d)| *d).sum();
        let mut out = String::new();
        for (name, d) in self.rows.iter().chain([&("total", total)]) {
            out += &format!("ferry: timing: {name:<10} {:>8.3} ms\n", ms(*d));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_and_total() {
        let mut s = Stages {
            last: Some(Instant::now()),
            rows: Vec::new(),
        };
        s.rows.push(("plan", Duration::from_micros(1500)));
        s.rows.push(("wait", Duration::from_micros(250)));
        assert_eq!(
            s.table(),
            "ferry: timing: plan          1.500 ms\n\
             ferry: timing: wait          0.250 ms\n\
             ferry: timing: total         1.750 ms\n"
        );
        let mut off = Stages {
            last: None,
            rows: Vec::new(),
        };
        off.mark("plan");
        assert!(off.rows.is_empty(), "off records nothing");
    }
}
