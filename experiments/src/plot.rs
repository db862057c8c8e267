//! SVG line charts for result tables.

use anyhow::{Result, anyhow};
use plotters::prelude::*;
use std::path::Path;

/// One named series of (x, y) points.
pub struct Series {
    /// Legend text.
    pub name: String,
    /// (x, y) in drawing order.
    pub points: Vec<(f64, f64)>,
}

impl Series {
    /// Named series from a map of unsorted points, each sorted by x.
    pub fn sorted(map: std::collections::BTreeMap<String, Vec<(f64, f64)>>) -> Vec<Series> {
        map.into_iter()
            .map(|(name, mut points)| {
                points.sort_by(|a, b| a.0.total_cmp(&b.0));
                Series { name, points }
            })
            .collect()
    }
}

/// Writes an SVG line chart with markers and a legend.
pub fn line_chart(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
) -> Result<()> {
    let all = series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::INFINITY,
        f64::NEG_INFINITY,
    );
    for &(x, y) in all {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if !x0.is_finite() {
        return Err(anyhow!("{}: nothing to plot", path.display()));
    }
    let pad = |lo: f64, hi: f64| {
        let span = (hi - lo).abs().max(1e-9);
        (lo - 0.05 * span, hi + 0.05 * span)
    };
    let ((x0, x1), (y0, y1)) = (pad(x0, x1), pad(y0.min(0.0), y1));
    let root = SVGBackend::new(path, (720, 440)).into_drawing_area();
    let draw = |e: &dyn std::fmt::Display| anyhow!("{}: {e}", path.display());
    root.fill(&WHITE).map_err(|e| draw(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(|e| draw(&e))?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .draw()
        .map_err(|e| draw(&e))?;
    for (i, s) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(
                s.points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(|e| draw(&e))?
            .label(s.name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
            });
        chart
            .draw_series(s.points.iter().map(|&p| Circle::new(p, 4, color.filled())))
            .map_err(|e| draw(&e))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| draw(&e))?;
    root.present().map_err(|e| draw(&e))?;
    Ok(())
}
