//! SVG charts drawn with plotters.
//!
//! - `accuracy-<scenario>.svg`: per contender, admissions per 100 ms (bars)
//!   and in the trailing 1 s (line, sampled every 10 ms) against the limit.
//! - `latency.svg`: latency against percentile for every bench contender.
//! - `soak-rss.svg`: resident memory over the soak.
//! - `soak-hostile-rss.svg`: resident memory and keys held over the hostile
//!   soak, against the bound it asserts.
//! - `overload-<workload>.svg`: goodput and admitted p99 per contender at
//!   1x, 2x and 4x the capacity.

use std::path::Path;

use plotters::prelude::*;

use crate::accuracy::Run;
use crate::bench::BenchRow;
use crate::hostile::{self, HostileResult};
use crate::overload::{self, WorkloadResult};
use crate::soak::SoakResult;

/// Turns any plotters error into a message naming the chart.
fn fail<E: std::fmt::Display>(chart: &Path) -> impl FnOnce(E) -> String + '_ {
    move |e| format!("cannot draw {}: {e}", chart.display())
}

/// One chart per scenario, one panel per contender; returns the files.
pub fn accuracy(dir: &Path, runs: &[Run]) -> Result<Vec<String>, String> {
    let mut files = Vec::new();
    let mut slugs: Vec<String> = runs.iter().map(|r| r.scenario.slug()).collect();
    slugs.dedup();
    for slug in slugs {
        let group: Vec<&Run> = runs.iter().filter(|r| r.scenario.slug() == slug).collect();
        let Some(first) = group.first() else { continue };
        let name = format!("accuracy-{slug}.svg");
        let path = dir.join(&name);
        let height = 60 + 220 * group.len() as u32;
        let root = SVGBackend::new(&path, (900, height)).into_drawing_area();
        root.fill(&WHITE).map_err(fail(&path))?;
        let root = root
            .titled(
                &format!(
                    "{}: admitted requests, limit {} per 1 s window",
                    first.scenario, first.limit
                ),
                ("sans-serif", 20),
            )
            .map_err(fail(&path))?;
        let panels = root.split_evenly((group.len(), 1));
        for (panel, run) in panels.iter().zip(&group) {
            draw_accuracy_panel(panel, run).map_err(fail(&path))?;
        }
        root.present().map_err(fail(&path))?;
        files.push(name);
    }
    Ok(files)
}

/// One contender's panel of an accuracy chart.
fn draw_accuracy_panel(
    panel: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    run: &Run,
) -> Result<(), Box<dyn std::error::Error>> {
    let limit = run.limit as f64;
    let seconds = run.per_bucket.len() as f64 / 10.0;
    let peak = run
        .trailing
        .iter()
        .map(|p| p.1)
        .chain(run.per_bucket.iter().copied())
        .max()
        .unwrap_or(0) as f64;
    let top = (peak.max(limit) * 1.15).max(1.0);
    let mut chart = ChartBuilder::on(panel)
        .caption(run.contender.name(), ("sans-serif", 15))
        .margin(6)
        .x_label_area_size(34)
        .y_label_area_size(48)
        .build_cartesian_2d(0f64..seconds.max(0.1), 0f64..top)?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("requests")
        .y_label_formatter(&|y| format!("{y:.0}"))
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    chart
        .draw_series(run.per_bucket.iter().enumerate().map(|(i, &n)| {
            let x = i as f64 / 10.0;
            Rectangle::new([(x, 0.0), (x + 0.1, n as f64)], BLUE.mix(0.45).filled())
        }))?
        .label("admitted per 100 ms")
        .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], BLUE.mix(0.45).filled()));
    chart
        .draw_series(LineSeries::new(
            run.trailing.iter().map(|&(x, n)| (x, n as f64)),
            RED.stroke_width(2),
        ))?
        .label("admitted in trailing 1 s")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 12, y)], RED.stroke_width(2)));
    chart
        .draw_series(DashedLineSeries::new(
            vec![(0.0, limit), (seconds, limit)],
            6,
            4,
            BLACK.stroke_width(1),
        ))?
        .label(format!("limit {}", run.limit))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 12, y)], BLACK));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .label_font(("sans-serif", 12))
        .draw()?;
    Ok(())
}

/// Latency against percentile for every bench row; returns the file.
pub fn latency(dir: &Path, rows: &[BenchRow]) -> Result<String, String> {
    let name = "latency.svg".to_owned();
    let path = dir.join(&name);
    let top = rows
        .iter()
        .map(|r| r.quantile(0.9999))
        .max()
        .unwrap_or(1)
        .max(2) as f64
        * 1.5;
    let draw = || -> Result<(), Box<dyn std::error::Error>> {
        let root = SVGBackend::new(&path, (900, 560)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                "Latency by percentile, limit never reached (loopback, closed loop)",
                ("sans-serif", 18),
            )
            .margin(10)
            .margin_right(40)
            .x_label_area_size(36)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..4.0, (10f64..top).log_scale())?;
        chart
            .configure_mesh()
            .x_desc("percentile")
            .y_desc("latency (µs)")
            .x_labels(5)
            .x_label_formatter(&|x| {
                let p = 100.0 * (1.0 - 10f64.powf(-*x));
                format!("p{}", (p * 100.0).round() / 100.0)
            })
            .y_label_formatter(&|y| format!("{y:.0}"))
            .draw()?;
        for (i, row) in rows.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let points: Vec<(f64, f64)> = (0..=400)
                .map(|k| {
                    let x = k as f64 / 100.0;
                    let q = (1.0 - 10f64.powf(-x)).min(0.9999);
                    (x, row.quantile(q).max(10) as f64)
                })
                .collect();
            chart
                .draw_series(LineSeries::new(points, color.stroke_width(2)))?
                .label(row.contender.name())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 14, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.3))
            .draw()?;
        root.present()?;
        Ok(())
    };
    draw().map_err(fail(&path))?;
    Ok(name)
}

/// Resident memory over the soak; returns the file.
pub fn soak(dir: &Path, result: &SoakResult) -> Result<String, String> {
    let (name, tier) = if result.compact {
        ("soak-compact-rss.svg".to_owned(), "compact layer, ")
    } else {
        ("soak-rss.svg".to_owned(), "")
    };
    let path = dir.join(&name);
    let end = result
        .samples
        .last()
        .map(|s| s.secs)
        .unwrap_or(1.0)
        .max(1.0);
    let top = result.samples.iter().map(|s| s.rss_kib).max().unwrap_or(1) as f64 / 1024.0 * 1.25;
    let draw = || -> Result<(), Box<dyn std::error::Error>> {
        let root = SVGBackend::new(&path, (900, 420)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                format!(
                    "Soak: resident memory, {tier}{} keys churned, max_keys {}",
                    result.keys, result.max_keys
                ),
                ("sans-serif", 18),
            )
            .margin(10)
            .x_label_area_size(36)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..end, 0f64..top.max(1.0))?;
        chart
            .configure_mesh()
            .x_desc("seconds")
            .y_desc("RSS (MiB)")
            .draw()?;
        chart
            .draw_series(LineSeries::new(
                result
                    .samples
                    .iter()
                    .map(|s| (s.secs, s.rss_kib as f64 / 1024.0)),
                BLUE.stroke_width(2),
            ))?
            .label("resident set (whole process)")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 14, y)], BLUE.stroke_width(2)));
        chart
            .draw_series(DashedLineSeries::new(
                vec![(result.warmup_secs, 0.0), (result.warmup_secs, top)],
                6,
                4,
                BLACK.stroke_width(1),
            ))?
            .label("end of warm-up")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 14, y)], BLACK));
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.3))
            .draw()?;
        root.present()?;
        Ok(())
    };
    draw().map_err(fail(&path))?;
    Ok(name)
}

/// Resident memory and keys held over the hostile soak; returns the file.
pub fn hostile(dir: &Path, result: &HostileResult) -> Result<String, String> {
    let name = "soak-hostile-rss.svg".to_owned();
    let path = dir.join(&name);
    let end = result
        .samples
        .last()
        .map(|s| s.secs)
        .unwrap_or(1.0)
        .max(1.0);
    let base = result.baseline_kib as f64 / 1024.0;
    let bound = base + (hostile::table_bound() + hostile::server_margin()) as f64 / 1048576.0;
    let top = (result.peak_kib() as f64 / 1024.0).max(bound) * 1.15;
    let max_keys = hostile::MAX_KEYS as f64;
    let draw = || -> Result<(), Box<dyn std::error::Error>> {
        let root = SVGBackend::new(&path, (900, 620)).into_drawing_area();
        root.fill(&WHITE)?;
        let root = root.titled(
            "Hostile soak: distinct maximum-size keys through axum::serve, default max_keys",
            ("sans-serif", 18),
        )?;
        let (upper, lower) = root.split_vertically(400);
        let mut chart = ChartBuilder::on(&upper)
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..end, 0f64..top.max(1.0))?;
        chart
            .configure_mesh()
            .x_desc("seconds")
            .y_desc("RSS (MiB)")
            .draw()?;
        chart
            .draw_series(LineSeries::new(
                result
                    .samples
                    .iter()
                    .map(|s| (s.secs, s.rss_kib as f64 / 1024.0)),
                BLUE.stroke_width(2),
            ))?
            .label("resident set (whole process: server and client)")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 14, y)], BLUE.stroke_width(2)));
        chart
            .draw_series(DashedLineSeries::new(
                vec![(0.0, bound), (end, bound)],
                6,
                4,
                RED.stroke_width(1),
            ))?
            .label("bound asserted: baseline + table (21 MiB) + server margin")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 14, y)], RED));
        chart
            .draw_series(DashedLineSeries::new(
                vec![(0.0, base), (end, base)],
                3,
                3,
                BLACK.stroke_width(1),
            ))?
            .label("baseline (after warm-up)")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 14, y)], BLACK));
        for p in result.phases.iter().skip(1) {
            chart.draw_series(DashedLineSeries::new(
                vec![(p.span.0, 0.0), (p.span.0, top)],
                6,
                4,
                BLACK.mix(0.5).stroke_width(1),
            ))?;
        }
        for p in &result.phases {
            chart.draw_series(std::iter::once(Text::new(
                p.phase.name(),
                (p.span.0 + end * 0.01, top * 0.95),
                ("sans-serif", 13),
            )))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.3))
            .draw()?;
        let mut keys = ChartBuilder::on(&lower)
            .margin(10)
            .x_label_area_size(36)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..end, 0f64..max_keys * 1.2)?;
        keys.configure_mesh()
            .x_desc("seconds")
            .y_desc("keys held")
            .y_label_formatter(&|y| format!("{y:.0}"))
            .draw()?;
        keys.draw_series(LineSeries::new(
            result.samples.iter().map(|s| (s.secs, s.keys as f64)),
            GREEN.stroke_width(2),
        ))?
        .label("keys in the table (StatsHandle::len, overflow entry included)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 14, y)], GREEN.stroke_width(2)));
        keys.draw_series(DashedLineSeries::new(
            vec![(0.0, max_keys), (end, max_keys)],
            6,
            4,
            BLACK.stroke_width(1),
        ))?
        .label("max_keys 4096")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 14, y)], BLACK));
        keys.configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.3))
            .draw()?;
        root.present()?;
        Ok(())
    };
    draw().map_err(fail(&path))?;
    Ok(name)
}

/// One overload workload: goodput (left) and admitted p99 (right, log
/// scale) per contender at each load factor; returns the file.
pub fn overload(dir: &Path, result: &WorkloadResult) -> Result<String, String> {
    let name = format!("overload-{}.svg", result.workload.slug());
    let path = dir.join(&name);
    let factors = overload::FACTORS;
    let runs = &result.runs;
    let width = 0.8 / runs.len().max(1) as f64;
    let x_of = |level: usize, run: usize| level as f64 - 0.4 + width * run as f64;
    let label = move |x: &f64| {
        let i = x.round();
        if (x - i).abs() < 0.01 && i >= 0.0 && (i as usize) < factors.len() {
            format!("{}x", factors[i as usize])
        } else {
            String::new()
        }
    };
    let good_top = runs
        .iter()
        .flat_map(|r| r.levels.iter().map(|l| l.goodput()))
        .fold(result.capacity, f64::max)
        * 1.2;
    let unloaded_p99 = result.unloaded.admitted_ms(0.99).max(0.01);
    let p99_top = runs
        .iter()
        .flat_map(|r| r.levels.iter().map(|l| l.admitted_ms(0.99)))
        .fold(3.0 * unloaded_p99, f64::max)
        * 2.0;
    let p99_bottom = (unloaded_p99 / 4.0).max(0.01);
    let draw = || -> Result<(), Box<dyn std::error::Error>> {
        let root = SVGBackend::new(&path, (1100, 520)).into_drawing_area();
        root.fill(&WHITE)?;
        let root = root.titled(
            &format!(
                "{} workload, open loop at 1x/2x/4x its capacity ({:.0} req/s)",
                result.workload.slug(),
                result.capacity
            ),
            ("sans-serif", 18),
        )?;
        let (left, right) = root.split_horizontally(550);
        let last = factors.len() as f64 - 0.5;
        let mut good = ChartBuilder::on(&left)
            .caption("goodput: 2xx within 1 s, per second", ("sans-serif", 15))
            .margin(8)
            .x_label_area_size(30)
            .y_label_area_size(56)
            .build_cartesian_2d(-0.5f64..last, 0f64..good_top)?;
        good.configure_mesh()
            .disable_x_mesh()
            .x_labels(factors.len() * 4 + 1)
            .x_label_formatter(&label)
            .y_desc("requests/s")
            .y_label_formatter(&|y| format!("{y:.0}"))
            .draw()?;
        let mut latency = ChartBuilder::on(&right)
            .caption("p99 latency of admitted requests (ms)", ("sans-serif", 15))
            .margin(8)
            .x_label_area_size(30)
            .y_label_area_size(56)
            .build_cartesian_2d(-0.5f64..last, (p99_bottom..p99_top).log_scale())?;
        latency
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(factors.len() * 4 + 1)
            .x_label_formatter(&label)
            .y_desc("ms")
            .y_label_formatter(&|y| format!("{y}"))
            .draw()?;
        for (r, run) in runs.iter().enumerate() {
            let color = Palette99::pick(r).to_rgba();
            good.draw_series(run.levels.iter().enumerate().map(|(l, level)| {
                let x = x_of(l, r);
                Rectangle::new(
                    [(x, 0.0), (x + width * 0.9, level.goodput())],
                    color.filled(),
                )
            }))?
            .label(run.guard.name())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
            latency.draw_series(run.levels.iter().enumerate().filter_map(|(l, level)| {
                let p99 = level.admitted_ms(0.99);
                (p99 > 0.0).then(|| {
                    let x = x_of(l, r);
                    Rectangle::new([(x, p99_bottom), (x + width * 0.9, p99)], color.filled())
                })
            }))?;
        }
        good.draw_series(DashedLineSeries::new(
            vec![(-0.5, result.capacity), (last, result.capacity)],
            6,
            4,
            BLACK.stroke_width(1),
        ))?
        .label("capacity (closed loop, no protection)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 12, y)], BLACK));
        latency
            .draw_series(DashedLineSeries::new(
                vec![(-0.5, 3.0 * unloaded_p99), (last, 3.0 * unloaded_p99)],
                6,
                4,
                RED.stroke_width(1),
            ))?
            .label("3x the unloaded p99")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 12, y)], RED));
        latency
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.3))
            .label_font(("sans-serif", 11))
            .draw()?;
        good.configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.3))
            .label_font(("sans-serif", 11))
            .draw()?;
        root.present()?;
        Ok(())
    };
    draw().map_err(fail(&path))?;
    Ok(name)
}
