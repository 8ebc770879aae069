//! The machine the run measured on: CPUs and load average (1 min) before, during (the highest
//! sample) and after the run, as rows of backend `run`, workload `machine`, impl `host`, so
//! that `results.json` alone says how loaded the machine was.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::stats::{Row, Sink};

/// The backend name of the machine rows.
pub const BACKEND: &str = "run";
const WORKLOAD: &str = "machine";
const IMP: &str = "host";

/// How often the load average is sampled during the run.
const SAMPLE: Duration = Duration::from_secs(5);

/// The 1-minute load average of `/proc/loadavg`; `None` outside Linux.
pub fn loadavg() -> Option<f64> {
    parse_loadavg(&std::fs::read_to_string("/proc/loadavg").ok()?)
}

fn parse_loadavg(text: &str) -> Option<f64> {
    text.split_whitespace().next()?.parse().ok()
}

/// Samples the load average in the background from `start` until `finish`.
pub struct Sampler {
    before: Option<f64>,
    max: Arc<Mutex<Option<f64>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Sampler {
    /// Reads the load now and every 5 s after.
    pub fn start() -> Sampler {
        let before = loadavg();
        let max = Arc::new(Mutex::new(before));
        let seen = Arc::clone(&max);
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(SAMPLE).await;
                if let Some(l) = loadavg() {
                    let mut m = seen.lock().unwrap_or_else(PoisonError::into_inner);
                    *m = Some(m.map_or(l, |m| m.max(l)));
                }
            }
        });
        Sampler { before, max, task }
    }

    /// Stops sampling and adds the machine rows: `cpus`, `loadavg_1m_before`,
    /// `loadavg_1m_max`, `loadavg_1m_after`, and the run's `run_seconds`, `quick` and `fsync`
    /// (1 or 0) and `started_unix`.
    pub fn finish(self, rows: &mut Vec<Row>, run: &RunFacts) {
        self.task.abort();
        let after = loadavg();
        let max = *self.max.lock().unwrap_or_else(PoisonError::into_inner);
        let max = max
            .zip(after)
            .map_or(max.or(after), |(m, a)| Some(m.max(a)));
        let mut sink = Sink {
            backend: BACKEND,
            rows,
        };
        let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
        let mut add = |metric: &str, v: Option<f64>, unit: &str| {
            if let Some(v) = v {
                sink.to(WORKLOAD, IMP).add(metric, v, unit);
            }
        };
        add("cpus", (cpus > 0).then_some(cpus as f64), "count");
        add("loadavg_1m_before", self.before, "load");
        add("loadavg_1m_max", max, "load");
        add("loadavg_1m_after", after, "load");
        add("run_seconds", Some(run.seconds), "s");
        add("quick", Some(f64::from(u8::from(run.quick))), "flag");
        add("fsync", Some(f64::from(u8::from(run.fsync))), "flag");
        add("started_unix", Some(run.started_unix as f64), "s");
    }
}

/// What the rows record about the run itself.
pub struct RunFacts {
    pub seconds: f64,
    pub quick: bool,
    pub fsync: bool,
    pub started_unix: u64,
}

/// A machine row's value.
pub fn get(rows: &[Row], metric: &str) -> Option<f64> {
    rows.iter()
        .find(|r| r.backend == BACKEND && r.workload == WORKLOAD && r.metric == metric)
        .map(|r| r.value)
}

/// "2 CPUs; load average (1 min) 1.6 before, 3.2 at most, 2.1 after the run", or what is
/// missing.
pub fn describe(rows: &[Row]) -> String {
    let cpus =
        get(rows, "cpus").map_or("CPUs not recorded".to_string(), |c| format!("{c:.0} CPUs"));
    let load = match (
        get(rows, "loadavg_1m_before"),
        get(rows, "loadavg_1m_max"),
        get(rows, "loadavg_1m_after"),
    ) {
        (Some(b), Some(m), Some(a)) => format!(
            "load average (1 min, `/proc/loadavg`) {b:.2} before, {m:.2} at most during, {a:.2} after the run"
        ),
        _ => "load average not recorded by this run".to_string(),
    };
    format!("{cpus}; {load}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_one_minute_load() {
        assert_eq!(parse_loadavg("1.58 1.29 1.52 2/345 6789\n"), Some(1.58));
        assert_eq!(parse_loadavg(""), None);
    }

    #[test]
    fn describes_the_recorded_load() {
        let mut rows = Vec::new();
        let mut sink = Sink {
            backend: BACKEND,
            rows: &mut rows,
        };
        sink.to(WORKLOAD, IMP).add("cpus", 2.0, "count");
        assert!(
            describe(&rows).contains("not recorded"),
            "{}",
            describe(&rows)
        );
        let mut sink = Sink {
            backend: BACKEND,
            rows: &mut rows,
        };
        let mut host = sink.to(WORKLOAD, IMP);
        host.add("loadavg_1m_before", 1.5, "load");
        host.add("loadavg_1m_max", 9.25, "load");
        host.add("loadavg_1m_after", 3.0, "load");
        let d = describe(&rows);
        assert!(
            d.starts_with("2 CPUs;") && d.contains("1.50 before, 9.25 at most during, 3.00 after"),
            "{d}"
        );
    }
}
