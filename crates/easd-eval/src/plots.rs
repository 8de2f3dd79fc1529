//! SVG plots (plotters' SVG backend only: no system fonts or image libraries needed).

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::error::{Error, Result};
use crate::report::Report;
use crate::stats::{Histogram, Interval};

const WIDTH: u32 = 900;
const HEIGHT: u32 = 520;

fn plot_err(path: &Path) -> impl Fn(&dyn std::fmt::Display) -> Error + '_ {
    move |e| Error::Plot { path: path.to_path_buf(), reason: e.to_string() }
}

macro_rules! tryp {
    ($path:expr, $e:expr) => {
        $e.map_err(|e| plot_err($path)(&e))?
    };
}

/// Accuracy per variant with its 95% Wilson interval.
pub fn accuracy_plot(path: &Path, report: &Report) -> Result<()> {
    let root = SVGBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    tryp!(path, root.fill(&WHITE));
    let n = report.variants.len() as i32;
    let labels: Vec<String> = report.variants.iter().map(|v| v.label.clone()).collect();
    let fmt = |x: &i32| usize::try_from(*x).ok().and_then(|i| labels.get(i)).cloned().unwrap_or_default();
    let mut chart = tryp!(
        path,
        ChartBuilder::on(&root)
            .caption("Accuracy per variant (95% Wilson interval)", ("sans-serif", 22))
            .margin(16)
            .x_label_area_size(60)
            .y_label_area_size(60)
            .build_cartesian_2d(-1..n, 0f64..100f64)
    );
    tryp!(
        path,
        chart
            .configure_mesh()
            .label_style(("sans-serif", 14))
            .disable_x_mesh()
            .x_labels(n.max(1) as usize + 2)
            .x_label_formatter(&fmt)
            .y_desc("accuracy (%)")
            .draw()
    );
    tryp!(
        path,
        chart.draw_series(report.variants.iter().enumerate().map(|(i, v)| {
            ErrorBar::new_vertical(
                i as i32,
                100.0 * v.interval.low,
                100.0 * v.accuracy,
                100.0 * v.interval.high,
                BLUE.stroke_width(2),
                18,
            )
        }))
    );
    tryp!(
        path,
        chart.draw_series(report.variants.iter().enumerate().map(|(i, v)| Circle::new(
            (i as i32, 100.0 * v.accuracy),
            5,
            BLUE.filled()
        )))
    );
    tryp!(path, root.present());
    Ok(())
}

/// One grid point of a sweep plot.
#[derive(Clone, Debug, PartialEq)]
pub struct SweepPlotPoint {
    /// The swept parameter's value (e.g. the τ percentile).
    pub x: f64,
    /// In [0, 1].
    pub accuracy: f64,
    pub interval: Interval,
    /// EASD triggers per generated token, in [0, 1].
    pub trigger_rate: f64,
}

/// One line of a sweep plot: the points of one (ρ, N) against the swept x value.
#[derive(Clone, Debug, PartialEq)]
pub struct SweepSeries {
    pub name: String,
    pub points: Vec<SweepPlotPoint>,
}

/// Two panels against an EASD parameter, one line per series: accuracy (with intervals and a dashed baseline such
/// as `sd` when given) and the trigger rate, the cost side of the choice (each trigger discards the draft's tail).
pub fn sweep_plot(path: &Path, x_desc: &str, series: &[SweepSeries], baseline: Option<(&str, f64)>) -> Result<()> {
    let root = SVGBackend::new(path, (WIDTH + WIDTH / 3, HEIGHT)).into_drawing_area();
    tryp!(path, root.fill(&WHITE));
    let (left, right) = root.split_horizontally((WIDTH + WIDTH / 3) / 2);
    let xs = series.iter().flat_map(|s| s.points.iter().map(|p| p.x));
    let (lo, hi) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| (lo.min(x), hi.max(x)));
    let (lo, hi) = if lo.is_finite() { (lo, hi) } else { (0.0, 1.0) };
    // A tenth of the range, or a twentieth of the value when only one x was swept (ρ lives in [0, 1], τ percentiles
    // near 100): the points stay off the frame on any axis.
    let pad = ((hi - lo) * 0.1).max(hi.abs() * 0.05).max(1e-3);
    let sorted = |s: &SweepSeries| {
        let mut points = s.points.clone();
        points.sort_by(|a, b| a.x.total_cmp(&b.x));
        points
    };

    let mut chart = tryp!(
        path,
        sweep_panel(&left, format!("Accuracy vs {x_desc}")).build_cartesian_2d((lo - pad)..(hi + pad), 0f64..100f64)
    );
    tryp!(path, chart.configure_mesh().label_style(("sans-serif", 14)).x_desc(x_desc).y_desc("accuracy (%)").draw());
    if let Some((name, acc)) = baseline {
        let style = BLACK.stroke_width(1);
        let dashes = DashedLineSeries::new([(lo - pad, 100.0 * acc), (hi + pad, 100.0 * acc)], 8, 6, style);
        tryp!(path, chart.draw_series(dashes))
            .label(format!("{name} (baseline)"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
    }
    for (i, s) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let points = sorted(s);
        let line = LineSeries::new(points.iter().map(|p| (p.x, 100.0 * p.accuracy)), color.stroke_width(2));
        tryp!(path, chart.draw_series(line))
            .label(s.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        let bars = points.iter().map(|p| {
            ErrorBar::new_vertical(p.x, 100.0 * p.interval.low, 100.0 * p.accuracy, 100.0 * p.interval.high, color, 8)
        });
        tryp!(path, chart.draw_series(bars));
    }
    // Lower left: accuracies sit in the upper half, where a legend would cover the intervals.
    tryp!(
        path,
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
    );

    let top = series.iter().flat_map(|s| s.points.iter().map(|p| 100.0 * p.trigger_rate)).fold(0.0, f64::max);
    let mut chart = tryp!(
        path,
        sweep_panel(&right, format!("EASD trigger rate vs {x_desc}"))
            .build_cartesian_2d((lo - pad)..(hi + pad), 0f64..(top * 1.2).max(1.0))
    );
    tryp!(
        path,
        chart.configure_mesh().label_style(("sans-serif", 14)).x_desc(x_desc).y_desc("triggers per token (%)").draw()
    );
    for (i, s) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let points = sorted(s);
        let line = LineSeries::new(points.iter().map(|p| (p.x, 100.0 * p.trigger_rate)), color.stroke_width(2));
        tryp!(path, chart.draw_series(line));
        tryp!(path, chart.draw_series(points.iter().map(|p| Circle::new((p.x, 100.0 * p.trigger_rate), 4, color))));
    }
    tryp!(path, root.present());
    Ok(())
}

/// A sweep plot panel's builder: caption and label areas shared by both panels.
fn sweep_panel<'a, 'b, DB: DrawingBackend>(
    area: &'a DrawingArea<DB, Shift>,
    caption: String,
) -> ChartBuilder<'a, 'b, DB> {
    let mut builder = ChartBuilder::on(area);
    builder.caption(caption, ("sans-serif", 20)).margin(16).x_label_area_size(50).y_label_area_size(60);
    builder
}

/// Two entropy distributions of one model, as densities over the same bins.
#[derive(Clone, Debug, PartialEq)]
pub struct EntropyPanel {
    /// e.g. "draft H(q̂)".
    pub title: String,
    /// All positions (teacher-forced calibration).
    pub all_positions: Histogram,
    /// Positions where EASD triggered (from the run's Summary triggers).
    pub triggered: Histogram,
    /// The threshold in force, drawn as a vertical line.
    pub tau: Option<f32>,
}

/// Side-by-side panels (one per model) of the entropy densities at all vs triggered positions.
pub fn entropy_plot(path: &Path, panels: &[EntropyPanel]) -> Result<()> {
    let root = SVGBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    tryp!(path, root.fill(&WHITE));
    let areas = root.split_evenly((1, panels.len().max(1)));
    for (panel, area) in panels.iter().zip(&areas) {
        let steps = |h: &Histogram| -> Vec<(f64, f64)> {
            let w = h.bin_width as f64;
            h.densities().iter().enumerate().flat_map(|(i, &d)| [(i as f64 * w, d), ((i + 1) as f64 * w, d)]).collect()
        };
        let all = steps(&panel.all_positions);
        let trig = steps(&panel.triggered);
        let x_max = all.iter().chain(&trig).filter(|p| p.1 > 0.0).map(|p| p.0).fold(1.0, f64::max);
        let y_max = all.iter().chain(&trig).map(|p| p.1).fold(0.1, f64::max) * 1.1;
        let mut chart = tryp!(
            path,
            ChartBuilder::on(area)
                .caption(&panel.title, ("sans-serif", 18))
                .margin(12)
                .x_label_area_size(40)
                .y_label_area_size(50)
                .build_cartesian_2d(0f64..x_max, 0f64..y_max)
        );
        tryp!(
            path,
            chart.configure_mesh().label_style(("sans-serif", 13)).x_desc("entropy (nats)").y_desc("density").draw()
        );
        let all_label = format!("all positions (n = {})", panel.all_positions.total());
        tryp!(path, chart.draw_series(LineSeries::new(all, BLUE.stroke_width(2))))
            .label(all_label)
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE.stroke_width(2)));
        let trig_label = format!("EASD-triggered (n = {})", panel.triggered.total());
        tryp!(path, chart.draw_series(LineSeries::new(trig, RED.stroke_width(2))))
            .label(trig_label)
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED.stroke_width(2)));
        if let Some(tau) = panel.tau {
            let tau = tau as f64;
            tryp!(
                path,
                chart.draw_series(DashedLineSeries::new([(tau, 0.0), (tau, y_max)], 6, 4, BLACK.stroke_width(1)))
            )
            .label(format!("τ = {tau:.2}"))
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK));
        }
        tryp!(path, chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw());
    }
    tryp!(path, root.present());
    Ok(())
}
