//! The SVG plot: handoff latency (p50) and server requests per handoff vs the number of queued
//! waiters, one line per backend and implementation.

use std::path::Path;

use plotters::prelude::*;

use crate::stats::Row;

const COLORS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

type Series = Vec<(String, Vec<(f64, f64)>)>;

/// (label, points) of the `waiters-N` rows `pick` selects, scaled by `scale`.
fn series(rows: &[Row], pick: impl Fn(&Row) -> bool, scale: f64) -> Series {
    let mut out: Series = Vec::new();
    for r in rows.iter().filter(|r| pick(r)) {
        let Some(n) = r
            .workload
            .strip_prefix("waiters-")
            .and_then(|n| n.parse::<f64>().ok())
        else {
            continue;
        };
        let label = format!("{} {}", r.backend, r.imp);
        let v = (r.value * scale).max(1e-3);
        match out.iter_mut().find(|(l, _)| *l == label) {
            Some((_, pts)) => pts.push((n, v)),
            None => out.push((label, vec![(n, v)])),
        }
    }
    for (_, pts) in &mut out {
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    out
}

fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    y_desc: &str,
    data: &Series,
) -> Result<(), String> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| format!("plot: {e}");
    let ys = data.iter().flat_map(|(_, p)| p.iter().map(|(_, y)| *y));
    let (lo, hi) = ys.fold((f64::INFINITY, 0.0f64), |(lo, hi), y| {
        (lo.min(y), hi.max(y))
    });
    let (lo, hi) = if lo.is_finite() {
        (lo / 2.0, hi * 2.0)
    } else {
        (0.01, 1.0)
    };
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((0.8f64..90f64).log_scale(), (lo..hi).log_scale())
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc("waiters queued behind the holder (N)")
        .y_desc(y_desc)
        .draw()
        .map_err(e)?;
    for (k, (label, pts)) in data.iter().enumerate() {
        let color = COLORS[k % COLORS.len()];
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
            .map_err(e)?
            .label(label.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
        chart
            .draw_series(pts.iter().map(|p| Circle::new(*p, 3, color.filled())))
            .map_err(e)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(e)?;
    Ok(())
}

/// Writes the two-panel SVG to `path`.
pub fn write(rows: &[Row], path: &Path) -> Result<(), String> {
    let root = SVGBackend::new(path, (1400, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| format!("plot: {e}"))?;
    let (left, right) = root.split_horizontally(700);
    panel(
        &left,
        "Handoff latency p50 vs waiters",
        "ms (log)",
        &series(rows, |r| r.metric == "handoff_p50", 1e-3),
    )?;
    // dlock: its own round-trip counter; peers: the server's count (see README).
    let requests = |r: &Row| {
        if r.imp == "dlock" {
            r.metric == "client_requests_per_handoff"
        } else {
            r.metric == "server_requests_per_handoff" || r.metric == "server_commands_per_handoff"
        }
    };
    panel(
        &right,
        "Requests per handoff vs waiters (dlock: client count; peers: server count)",
        "requests (log)",
        &series(rows, requests, 1.0),
    )?;
    root.present().map_err(|e| format!("plot: {e}"))?;
    Ok(())
}
