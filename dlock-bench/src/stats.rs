//! Result rows and small statistics helpers.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// One measurement: `{"backend","workload","impl","metric","value","unit"}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Row {
    pub backend: String,
    pub workload: String,
    #[serde(rename = "impl")]
    pub imp: String,
    pub metric: String,
    pub value: f64,
    pub unit: String,
}

/// Collects the rows of one backend.
pub struct Sink<'a> {
    pub backend: &'a str,
    pub rows: &'a mut Vec<Row>,
}

impl Sink<'_> {
    /// The rows of `workload` and contender `imp`.
    pub fn to<'r>(&'r mut self, workload: &'r str, imp: &'r str) -> Rows<'r> {
        Rows {
            backend: self.backend,
            workload,
            imp,
            rows: self.rows,
        }
    }
}

/// Collects the rows of one workload and contender.
pub struct Rows<'r> {
    backend: &'r str,
    workload: &'r str,
    imp: &'r str,
    rows: &'r mut Vec<Row>,
}

impl Rows<'_> {
    /// Adds a row (NaN and infinities are skipped: a missing figure stays missing).
    pub fn add(&mut self, metric: &str, value: f64, unit: &str) {
        if !value.is_finite() {
            return;
        }
        self.rows.push(Row {
            backend: self.backend.to_string(),
            workload: self.workload.to_string(),
            imp: self.imp.to_string(),
            metric: metric.to_string(),
            value,
            unit: unit.to_string(),
        });
    }

    /// p50 and p99 of `samples` in µs, as `<prefix>_p50` / `<prefix>_p99`.
    pub fn percentiles(&mut self, prefix: &str, samples: &mut [Duration]) {
        if samples.is_empty() {
            return;
        }
        samples.sort_unstable();
        for (p, tag) in [(0.50, "p50"), (0.99, "p99")] {
            let v = percentile(samples, p).as_secs_f64() * 1e6;
            self.add(&format!("{prefix}_{tag}"), v, "us");
        }
    }
}

/// The p-th percentile (nearest rank) of sorted samples.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((sorted.len() as f64) * p).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// This process's resident set size in bytes (`/proc/self/statm`, 4 KiB pages); `None`
/// outside Linux.
pub fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// Rows for tests, one a line: `backend workload impl metric value unit`.
#[cfg(test)]
pub fn rows(text: &str) -> Vec<Row> {
    let row = |line: &str| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let value = f.get(4)?.parse().ok()?;
        let [backend, workload, imp, metric] = [0, 1, 2, 3].map(|i| f[i].to_string());
        let unit = f.get(5)?.to_string();
        Some(Row {
            backend,
            workload,
            imp,
            metric,
            value,
            unit,
        })
    };
    let lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    lines
        .map(|l| row(l).unwrap_or_else(|| panic!("not a row: {l}")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_micros).collect();
        assert_eq!(percentile(&v, 0.5), Duration::from_micros(50));
        assert_eq!(percentile(&v, 0.99), Duration::from_micros(99));
        assert_eq!(percentile(&v[..1], 0.99), Duration::from_micros(1));
        assert_eq!(percentile(&[], 0.5), Duration::ZERO);
    }

    #[test]
    fn rows_skip_missing_values() {
        let mut rows = Vec::new();
        let mut s = Sink {
            backend: "redis",
            rows: &mut rows,
        };
        s.to("w", "dlock").add("m", f64::NAN, "x");
        s.to("w", "dlock").add("m", 2.0, "x");
        assert_eq!(rows.len(), 1);
        let json = serde_json::to_string(&rows[0]).unwrap_or_default();
        assert!(json.contains("\"impl\":\"dlock\""), "{json}");
    }
}
