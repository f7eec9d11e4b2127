//! The method: every experiment is a list of [`Case`]s (a configuration at a parameter
//! value, a client command, and how to read metrics from its run). [`measure`] gives
//! each case one warm-up run, then `runs` repetitions in which the cases alternate,
//! odd repetitions in reverse (A B C, C B A, A B C …: [`rep_order`]), and keeps every
//! sample and every failure. Medians with min/max are taken at the end; nothing here
//! judges a time.
//!
//! A case whose warm-up fails is not repeated (its rows say why); after two timed-out
//! warm-ups of the same client program under a configuration, that pair is not tried
//! again in the same experiment, so a hanging configuration costs minutes, not hours.

use std::collections::BTreeMap;
use std::time::Duration;

use indicatif::ProgressBar;

use crate::config::{Config, Env, RunOut};
use crate::exec::ExecError;
use crate::topology::Testbed;

/// A parameter value: its label in tables and its position on a plot's x axis.
#[derive(Clone, Debug, PartialEq)]
pub struct Param {
    /// E.g. "4K", "10us", "batch 8", "redis GET -P 16", or "-" for none.
    pub label: String,
    /// Numeric value for plots (bytes, µs, batch size, test index).
    pub x: f64,
}

impl Param {
    /// A parameter.
    pub fn new(label: impl Into<String>, x: f64) -> Param {
        Param {
            label: label.into(),
            x,
        }
    }

    /// No parameter (a reference configuration).
    pub fn none() -> Param {
        Param::new("-", f64::NAN)
    }
}

/// Metrics of one run: (name, unit, value).
pub type Metrics = Vec<(&'static str, &'static str, f64)>;

/// Reads metrics from a successful run; an error marks it failed.
pub type Extract = Box<dyn Fn(&RunOut) -> Result<Metrics, String>>;

/// One run's metrics, or why it failed and whether it timed out.
type RunResult = Result<Metrics, (String, bool)>;

/// One point of an experiment.
pub struct Case {
    /// Where the client runs.
    pub config: Config,
    /// The parameter value.
    pub param: Param,
    /// The client's argv.
    pub client: Vec<String>,
    /// Killed after this.
    pub timeout: Duration,
    /// Run the whole configuration on this CPU.
    pub pin: Option<usize>,
    /// Remote servers (ports) to restart after a failed run.
    pub servers: Vec<u16>,
    /// Metrics of a run.
    pub extract: Extract,
}

impl Case {
    /// The client program's name (for `sh -c SCRIPT`, the script's last program that
    /// talks to the network is not known: the whole case counts as "sh").
    pub fn program(&self) -> String {
        let first = self.client.first().map(String::as_str).unwrap_or("");
        first.rsplit('/').next().unwrap_or(first).to_owned()
    }
}

impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Case")
            .field("config", &self.config.name)
            .field("param", &self.param.label)
            .field("client", &self.client)
            .finish_non_exhaustive()
    }
}

/// All samples of one metric of one case.
#[derive(Clone, Debug)]
pub struct Row {
    /// E1, E2, …
    pub experiment: String,
    /// Configuration name.
    pub config: String,
    /// Parameter.
    pub param: Param,
    /// Metric name (e.g. "bandwidth").
    pub metric: String,
    /// Unit (e.g. "Gbit/s").
    pub unit: String,
    /// One value per successful measured run.
    pub samples: Vec<f64>,
    /// Measured runs planned.
    pub planned: usize,
    /// Why runs failed (first few, deduplicated).
    pub failures: Vec<String>,
}

impl Row {
    /// Median of the samples (None when every run failed).
    pub fn median(&self) -> Option<f64> {
        let mut v = self.samples.clone();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        Some(if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        })
    }

    /// Smallest sample.
    pub fn min(&self) -> Option<f64> {
        self.samples.iter().copied().reduce(f64::min)
    }

    /// Largest sample.
    pub fn max(&self) -> Option<f64> {
        self.samples.iter().copied().reduce(f64::max)
    }
}

/// The row of `config` at parameter `param` with `metric`, among one experiment's rows.
pub fn find<'a>(rows: &'a [Row], config: &str, param: &str, metric: &str) -> Option<&'a Row> {
    rows.iter()
        .find(|r| r.config == config && r.param.label == param && r.metric == metric)
}

/// The median of [`find`]'s row, if it exists and has samples.
pub fn median(rows: &[Row], config: &str, param: &str, metric: &str) -> Option<f64> {
    find(rows, config, param, metric).and_then(Row::median)
}

/// Per-case bookkeeping while measuring.
#[derive(Debug, Default)]
struct Tally {
    /// metric name -> (unit, samples)
    metrics: BTreeMap<&'static str, (&'static str, Vec<f64>)>,
    /// Metric names in first-seen order.
    order: Vec<&'static str>,
    failures: Vec<String>,
    dead: bool,
}

impl Tally {
    fn fail(&mut self, why: String) {
        if self.failures.len() < 3 && !self.failures.contains(&why) {
            self.failures.push(why);
        }
    }
}

/// Everything [`measure`] needs besides the cases.
#[derive(Debug)]
pub struct Bench<'a> {
    /// How configurations run.
    pub env: &'a Env,
    /// The remote (servers restarted after failures).
    pub bed: &'a mut Testbed,
    /// Progress.
    pub bar: &'a ProgressBar,
    /// Measured repetitions.
    pub runs: usize,
}

/// Runs the cases: warm-up each, then `runs` alternating repetitions. Returns one row
/// per (case, metric) — a case that never succeeded gets one row, named `metric_hint`.
pub fn measure(
    b: &mut Bench<'_>,
    experiment: &str,
    cases: &[Case],
    metric_hint: (&str, &str),
) -> Result<Vec<Row>, ExecError> {
    let mut tallies: Vec<Tally> = cases.iter().map(|_| Tally::default()).collect();
    // Timed-out warm-ups per (configuration, client program).
    let mut timeouts: BTreeMap<(String, String), usize> = BTreeMap::new();
    for (case, tally) in cases.iter().zip(&mut tallies) {
        let label = format!(
            "{experiment} {} {} (warm-up)",
            case.config.name, case.param.label
        );
        status(b.bar, label);
        let key = (case.config.name.clone(), case.program());
        if timeouts.get(&key).copied().unwrap_or(0) >= 2 {
            tally.fail(format!(
                "not attempted: two earlier {} runs under {} timed out in {experiment}",
                key.1, key.0
            ));
            tally.dead = true;
            b.bar.inc(1 + b.runs as u64);
            continue;
        }
        let mut warm = run_once(b, case)?;
        if matches!(warm, Err((_, false))) {
            // One more try for a failure that was not a hang (e.g. a server restarting).
            warm = run_once(b, case)?;
        }
        b.bar.inc(1);
        if let Err((why, timed_out)) = warm {
            if timed_out {
                *timeouts.entry(key).or_default() += 1;
            }
            tally.fail(format!("warm-up {why}"));
            tally.dead = true;
            b.bar.inc(b.runs as u64);
        }
    }
    for rep in 0..b.runs {
        for i in rep_order(rep, cases.len()) {
            let (case, tally) = (&cases[i], &mut tallies[i]);
            if tally.dead {
                continue;
            }
            status(
                b.bar,
                format!(
                    "{experiment} {} {} (run {}/{})",
                    case.config.name,
                    case.param.label,
                    rep + 1,
                    b.runs
                ),
            );
            match run_once(b, case)? {
                Ok(values) => {
                    for (name, unit, v) in values {
                        if !tally.metrics.contains_key(name) {
                            tally.order.push(name);
                        }
                        tally
                            .metrics
                            .entry(name)
                            .or_insert((unit, Vec::new()))
                            .1
                            .push(v);
                    }
                }
                Err((why, _)) => tally.fail(why),
            }
            b.bar.inc(1);
        }
    }
    let mut rows = Vec::new();
    for (case, tally) in cases.iter().zip(tallies) {
        let row = |metric: &str, unit: &str, samples: Vec<f64>| Row {
            experiment: experiment.to_owned(),
            config: case.config.name.clone(),
            param: case.param.clone(),
            metric: metric.to_owned(),
            unit: unit.to_owned(),
            samples,
            planned: b.runs,
            failures: tally.failures.clone(),
        };
        if tally.order.is_empty() {
            rows.push(row(metric_hint.0, metric_hint.1, Vec::new()));
        }
        for name in &tally.order {
            let (unit, samples) = &tally.metrics[name];
            rows.push(row(name, unit, samples.clone()));
        }
    }
    Ok(rows)
}

/// The order of `n` cases in repetition `rep`: as listed in even repetitions, reversed
/// in odd ones. Run by hand on this machine, the second of an alternating A/B pair was
/// about 10% faster in one test whichever build it was (session 42); with a fixed order
/// a case that always follows the same other one would carry that as its own.
pub fn rep_order(rep: usize, n: usize) -> Vec<usize> {
    if rep.is_multiple_of(2) {
        (0..n).collect()
    } else {
        (0..n).rev().collect()
    }
}

/// Shows what runs now: on the bar, or as a log line when the bar is hidden.
fn status(bar: &ProgressBar, msg: String) {
    if bar.is_hidden() {
        println!(
            "[{}/{}] {msg}",
            bar.position() + 1,
            bar.length().unwrap_or(0)
        );
    } else {
        bar.set_message(msg);
    }
}

/// One run of a case: metrics, or (why it failed, whether it timed out).
fn run_once(b: &mut Bench<'_>, case: &Case) -> Result<RunResult, ExecError> {
    let server_before = b.bed.cpu_of(&case.servers);
    let mut out = case
        .config
        .run(&case.client, case.timeout, case.pin, b.env)?;
    out.server_cpu = server_before
        .zip(b.bed.cpu_of(&case.servers))
        .map(|(a, z)| z.saturating_sub(a));
    let result = if out.outcome.success() {
        (case.extract)(&out).map_err(|e| (e, false))
    } else {
        Err((out.outcome.failure(), out.outcome.timed_out))
    };
    if result.is_err() {
        for port in &case.servers {
            if let Err(e) = b.bed.restart(*port) {
                crate::say(
                    b.bar,
                    &format!("warning: restarting the server on port {port}: {e}"),
                );
            }
        }
    }
    // A server that died on its own (not after a failure of ours) is revived too.
    if let Err(e) = b.bed.revive() {
        crate::say(b.bar, &format!("warning: reviving servers: {e}"));
    }
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(samples: Vec<f64>) -> Row {
        Row {
            experiment: "E1".into(),
            config: "native".into(),
            param: Param::none(),
            metric: "bandwidth".into(),
            unit: "Gbit/s".into(),
            samples,
            planned: 5,
            failures: Vec::new(),
        }
    }

    #[test]
    fn odd_repetitions_run_the_cases_in_reverse() {
        assert_eq!(rep_order(0, 3), [0, 1, 2]);
        assert_eq!(rep_order(1, 3), [2, 1, 0]);
        assert_eq!(rep_order(2, 3), [0, 1, 2]);
        assert!(rep_order(5, 0).is_empty());
        // Over two repetitions every ordered pair of neighbours meets both ways.
        let order: Vec<usize> = (0..2).flat_map(|r| rep_order(r, 4)).collect();
        for (a, b) in [(0, 1), (1, 2), (2, 3)] {
            let follows = |x: usize, y: usize| order.windows(2).any(|w| w == [x, y]);
            assert!(follows(a, b) && follows(b, a), "{a} {b} in {order:?}");
        }
    }

    #[test]
    fn median_min_max() {
        let r = row(vec![3.0, 1.0, 2.0]);
        assert_eq!(r.median(), Some(2.0));
        assert_eq!(r.min(), Some(1.0));
        assert_eq!(r.max(), Some(3.0));
        assert_eq!(row(vec![4.0, 1.0, 2.0, 3.0]).median(), Some(2.5));
        assert_eq!(row(vec![]).median(), None);
    }
}
