//! The flash sale's table (the design documents' figures beside ours) and its verdicts: dlock
//! accepting a stale write with fencing on, a contender that did not run, and a paused run the
//! nemesis did not bite all fail the bench.

use std::fmt::Write as _;

use super::contenders::{ALL, Lock, Spec};
use super::{CALM, PAUSES};
use crate::report::{fmt_value, get};
use crate::stats::Row;

fn g(rows: &[Row], spec: &Spec, workload: &str, metric: &str) -> Option<f64> {
    get(rows, spec.backend, workload, spec.imp, metric)
}

/// Whether `workload` is one of the flash sale's.
pub fn is_flash(workload: &str) -> bool {
    workload == CALM || workload == PAUSES
}

/// Why the run fails, from the flash-sale rows (none: it stands).
pub fn failures(rows: &[Row]) -> Vec<String> {
    let mut out = Vec::new();
    for spec in &ALL {
        for workload in [CALM, PAUSES] {
            let ran = rows
                .iter()
                .any(|r| r.backend == spec.backend && r.imp == spec.imp && r.workload == workload);
            if !ran {
                continue;
            }
            let m = |metric: &str| g(rows, spec, workload, metric);
            let at = format!("{}/{workload}/{}", spec.backend, spec.imp);
            if m("sections").unwrap_or(0.0) == 0.0 {
                out.push(format!("{at}: no critical section completed"));
            }
            let stale = m("stale_writes_fenced").unwrap_or(0.0);
            if spec.lock == Lock::Dlock && stale > 0.0 {
                out.push(format!(
                    "{at}: the fenced resource accepted {stale} stale write(s) from dlock's holders"
                ));
            }
            if workload == PAUSES && m("pauses").unwrap_or(0.0) == 0.0 {
                out.push(format!("{at}: the nemesis paused no holder"));
            }
            if workload == PAUSES
                && spec.lock == Lock::Dlock
                && m("paused_overtaken").unwrap_or(0.0) == 0.0
            {
                out.push(format!(
                    "{at}: no paused holder was overtaken, so fencing was not put to the test"
                ));
            }
        }
    }
    out
}

fn label(spec: &Spec) -> &'static str {
    match (spec.lock, spec.backend) {
        (Lock::Seed, _) => "seed's `SET NX PX` + compare-and-delete, no renewal",
        (Lock::Peer, "redlock") => "rslock 0.10, 5 nodes",
        (Lock::Peer, "etcd") => "etcd-client 0.21 `lock`, lease kept alive",
        (Lock::Peer, _) => "zookeeper-client 0.11 lock (Curator's layout)",
        (Lock::Dlock, "redis") => "dlock `RedisLocker`",
        (Lock::Dlock, "redlock") => "dlock `RedlockLocker`",
        (Lock::Dlock, "etcd") => "dlock `EtcdLocker`",
        (Lock::Dlock, _) => "dlock `ZkLocker`",
    }
}

/// A run's three figures: P99 acquire, conflict rate, stale writes accepted (fencing off /
/// on), or dashes when it did not run.
fn figures(rows: &[Row], spec: &Spec, workload: &str) -> [String; 3] {
    let m = |metric: &str| g(rows, spec, workload, metric);
    if m("sections").is_none() {
        return ["–", "–", "–"].map(str::to_string);
    }
    let p99 = m("acquire_p99").map_or("–".to_string(), |v| format!("{:.1} ms", v / 1000.0));
    let rate = match (m("conflict_rate"), m("conflicts"), m("sections")) {
        (Some(r), Some(c), Some(s)) => format!("{r:.3}% ({c:.0} of {s:.0})"),
        _ => "–".to_string(),
    };
    let count = |v: Option<f64>| v.map_or("–".to_string(), |v| format!("{v:.0}"));
    let on = if spec.fenced {
        count(m("stale_writes_fenced"))
    } else {
        "no token".to_string()
    };
    let stale = format!("{} / {on}", count(m("stale_writes_unfenced")));
    [p99, rate, stale]
}

/// The flash sale's section of the report and the README (`None`: no flash-sale rows).
pub fn markdown(rows: &[Row]) -> Option<String> {
    let ran: Vec<&Spec> = ALL
        .iter()
        .filter(|s| {
            rows.iter()
                .any(|r| r.backend == s.backend && r.imp == s.imp && is_flash(&r.workload))
        })
        .collect();
    let first = ran.first()?;
    let setting = |metric: &str| {
        [PAUSES, CALM]
            .iter()
            .find_map(|w| g(rows, first, w, metric))
    };
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Flash sale: {} client processes on {} hot names, {} s per run, TTL {}; the pause \
         nemesis stops a holder inside its section (SIGSTOP) for {}, one pause armed {} after \
         the previous one ended. Each client's write goes to a resource that judges it twice: \
         unfenced (fencing off: every write accepted) and fenced (fencing on: a token below the \
         name's highest is rejected).\n",
        setting("clients").map_or("?".to_string(), |v| format!("{v:.0}")),
        setting("names").map_or("?".to_string(), |v| format!("{v:.0}")),
        setting("seconds").map_or("?".to_string(), |v| format!("{v:.0}")),
        setting("ttl").map_or("?".to_string(), |v| fmt_value(v / 1000.0, "") + " ms"),
        g(rows, first, PAUSES, "pause")
            .map_or("–".to_string(), |v| fmt_value(v / 1000.0, "") + " ms"),
        g(rows, first, PAUSES, "pause_every")
            .map_or("–".to_string(), |v| fmt_value(v / 1000.0, "") + " ms"),
    );
    let _ = writeln!(
        s,
        "| seed's row: P99 / conflict rate (quoted) | contender | no pauses: P99 acquire | conflict rate | stale writes accepted, fencing off / on | with pauses: P99 acquire | conflict rate | stale writes accepted, fencing off / on | pauses (overtaken) |"
    );
    let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for spec in ran {
        let (row, p99, rate) = spec.quoted;
        let [a, b, c] = figures(rows, spec, CALM);
        let [d, e, f] = figures(rows, spec, PAUSES);
        let pauses = match (
            g(rows, spec, PAUSES, "pauses"),
            g(rows, spec, PAUSES, "paused_overtaken"),
        ) {
            (Some(p), Some(o)) => format!("{p:.0} ({o:.0})"),
            _ => "–".to_string(),
        };
        let _ = writeln!(
            s,
            "| {row}: {p99} / {rate} | {} | {a} | {b} | {c} | {d} | {e} | {f} | {pauses} |",
            label(spec)
        );
    }
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::rows as parse;

    fn run(stale_fenced: u32, overtaken: u32) -> Vec<Row> {
        parse(&format!(
            "redis flash-sale dlock sections 900 count
             redis flash-sale dlock conflicts 0 count
             redis flash-sale dlock conflict_rate 0 %
             redis flash-sale dlock stale_writes_unfenced 0 count
             redis flash-sale dlock stale_writes_fenced 0 count
             redis flash-sale dlock acquire_p99 2500 us
             redis flash-sale-pauses dlock sections 800 count
             redis flash-sale-pauses dlock conflicts 40 count
             redis flash-sale-pauses dlock conflict_rate 5 %
             redis flash-sale-pauses dlock stale_writes_unfenced 3 count
             redis flash-sale-pauses dlock stale_writes_fenced {stale_fenced} count
             redis flash-sale-pauses dlock pauses 3 count
             redis flash-sale-pauses dlock paused_overtaken {overtaken} count
             redis flash-sale-pauses dlock clients 32 count
             redis flash-sale-pauses seed-setnx sections 700 count
             redis flash-sale-pauses seed-setnx stale_writes_unfenced 3 count
             redis flash-sale-pauses seed-setnx pauses 3 count
             redis flash-sale-pauses seed-setnx paused_overtaken 0 count"
        ))
    }

    #[test]
    fn a_stale_write_through_dlocks_fence_fails_the_run() {
        assert!(
            failures(&run(0, 3)).is_empty(),
            "{:?}",
            failures(&run(0, 3))
        );
        let f = failures(&run(1, 3));
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(
            f[0].contains("redis/flash-sale-pauses/dlock") && f[0].contains("stale"),
            "{f:?}"
        );
    }

    #[test]
    fn a_pause_run_must_pause_and_overtake_dlock() {
        let f = failures(&run(0, 0));
        assert!(f.iter().any(|f| f.contains("not put to the test")), "{f:?}");
        let mut rows = run(0, 3);
        rows.retain(|r| !(r.imp == "seed-setnx" && r.metric == "pauses"));
        let f = failures(&rows);
        assert!(
            f.iter()
                .any(|f| f.contains("seed-setnx") && f.contains("paused no holder")),
            "{f:?}"
        );
    }

    #[test]
    fn the_table_puts_the_quoted_figures_beside_ours() {
        let md = markdown(&run(0, 3)).unwrap_or_default();
        let line = md
            .lines()
            .find(|l| l.contains("dlock `RedisLocker`"))
            .unwrap_or_default();
        assert!(line.starts_with("| Redis `SET NX`: 2 ms / 0.01% |"), "{md}");
        assert!(
            line.contains("| 2.5 ms | 0.000% (0 of 900) | 0 / 0 |"),
            "{line}"
        );
        assert!(
            line.contains("| 5.000% (40 of 800) | 3 / 0 | 3 (3) |"),
            "{line}"
        );
        let seed = md
            .lines()
            .find(|l| l.contains("seed's `SET NX PX`"))
            .unwrap_or_default();
        assert!(seed.contains("3 / no token"), "{seed}");
        assert!(markdown(&run(0, 3)[..0]).is_none());
    }
}
