//! SVG line charts for result tables: one panel or a grid of panels (facets) sharing a legend that
//! sits beside the plots, never on the data, and inside the canvas. A panel draws at most
//! [`MAX_SERIES_PER_PANEL`] series (more become small multiples). A discrete sweep (ranks, block
//! sizes) is drawn at evenly spaced ticks labelled with its values, and its axis title says so;
//! values spanning decades get a log axis.

use crate::results::significant;
use anyhow::{Result, anyhow};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;

/// One named series of (x, y) points.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// (x, y) in drawing order.
    pub points: Vec<(f64, f64)>,
}

impl Series {
    /// Named series from a map of unsorted points, each sorted by x.
    pub fn sorted(map: BTreeMap<String, Vec<(f64, f64)>>) -> Vec<Series> {
        map.into_iter()
            .map(|(name, mut points)| {
                points.sort_by(|a, b| a.0.total_cmp(&b.0));
                Series { name, points }
            })
            .collect()
    }
}

/// One panel of a faceted figure: its title and its series.
#[derive(Debug, Clone)]
pub struct Panel {
    /// What the panel's rows share (empty for a single panel).
    pub name: String,
    /// Its series; a series name means the same line (colour, marker) in every panel.
    pub series: Vec<Series>,
}

impl Panel {
    /// Panels from `(panel, series) -> points`, in key order, each series sorted by x.
    pub fn grouped(map: BTreeMap<(String, String), Vec<(f64, f64)>>) -> Vec<Panel> {
        let mut panels: BTreeMap<String, BTreeMap<String, Vec<(f64, f64)>>> = BTreeMap::new();
        for ((panel, series), points) in map {
            panels.entry(panel).or_default().insert(series, points);
        }
        panels
            .into_iter()
            .map(|(name, series)| Panel {
                name,
                series: Series::sorted(series),
            })
            .collect()
    }
}

/// How an axis places its values.
#[derive(Debug, Clone, PartialEq)]
pub enum Scale {
    /// Proportional.
    Linear,
    /// Proportional to the logarithm (positive values).
    Log,
    /// Log when the positive values span more than 30×, else linear (y axes).
    Auto,
    /// The distinct values that occur, evenly spaced and labelled with themselves (a sweep's ranks,
    /// block sizes, lengths).
    Discrete,
    /// x = 0, 1, 2 ... labelled with these names.
    Named(Vec<String>),
}

/// An axis: its label and scale.
#[derive(Debug, Clone)]
pub struct Axis {
    /// What it shows, with its unit.
    pub label: String,
    /// How it places values.
    pub scale: Scale,
}

impl Axis {
    /// An axis of `label` on `scale`.
    pub fn new(label: &str, scale: Scale) -> Axis {
        Axis {
            label: label.to_owned(),
            scale,
        }
    }
}

/// A figure's title and axes.
pub struct Chart<'a> {
    /// Above the panels.
    pub title: &'a str,
    /// The x axis of every panel.
    pub x: Axis,
    /// The y axis of every panel.
    pub y: Axis,
}

/// Colours that stay apart on white (Tableau's ten).
const COLOURS: [(u8, u8, u8); 10] = [
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
    (188, 189, 34),
    (23, 190, 207),
];

/// A series' look: its colour and marker shape. Markers differ from one series to the next (a
/// filled dot, a wider ring, a cross), so that a line lying exactly on another still shows.
fn look(i: usize) -> (RGBColor, usize) {
    let (r, g, b) = COLOURS[i % COLOURS.len()];
    (RGBColor(r, g, b), i % 3)
}

/// Series `i`'s marker at `at`.
fn marker<'a, DB: DrawingBackend, C: Clone + 'static>(at: C, i: usize) -> DynElement<'a, DB, C> {
    let (colour, shape) = look(i);
    match shape {
        0 => Circle::new(at, 4, colour.filled()).into_dyn(),
        1 => Circle::new(at, 7, colour.stroke_width(2)).into_dyn(),
        _ => Cross::new(at, 6, colour.stroke_width(2)).into_dyn(),
    }
}

/// A tick label: whole numbers whole, others to `digits` significant digits without trailing zeros.
fn tick(v: f64, digits: usize) -> String {
    if v.fract() == 0.0 && v.abs() < 1e9 {
        return format!("{v:.0}");
    }
    let text = significant(v, digits);
    if text.contains('.') && !text.contains('e') {
        text.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        text
    }
}

/// Maps data values to drawn positions and back to tick labels.
struct Placement {
    scale: Scale,
    /// Discrete: the distinct values, sorted.
    values: Vec<f64>,
}

impl Placement {
    fn new(scale: &Scale, data: impl Iterator<Item = f64>) -> Placement {
        let mut values: Vec<f64> = data.filter(|v| v.is_finite()).collect();
        values.sort_by(f64::total_cmp);
        values.dedup();
        let positive = values.iter().copied().filter(|&v| v > 0.0);
        let (lo, hi) = positive.fold((f64::INFINITY, 0.0f64), |(l, h), v| (l.min(v), h.max(v)));
        let all_positive = values.first().is_some_and(|&v| v > 0.0);
        let scale = match scale {
            Scale::Auto if all_positive && hi / lo > 30.0 => Scale::Log,
            Scale::Auto => Scale::Linear,
            Scale::Log if !all_positive => Scale::Linear,
            other => other.clone(),
        };
        Placement { scale, values }
    }

    fn place(&self, v: f64) -> f64 {
        match &self.scale {
            Scale::Log => v.log10(),
            Scale::Discrete => self
                .values
                .iter()
                .position(|&x| x == v)
                .map_or(f64::NAN, |i| i as f64),
            _ => v,
        }
    }

    /// The drawn range, padded by 5% (and a half step for discrete and named axes).
    fn range(&self, drawn: &[f64], from_zero: bool) -> (f64, f64) {
        let (mut lo, mut hi) = drawn
            .iter()
            .filter(|v| v.is_finite())
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &v| {
                (l.min(v), h.max(v))
            });
        if !lo.is_finite() {
            return (0.0, 1.0);
        }
        match self.scale {
            Scale::Discrete | Scale::Named(_) => return (lo - 0.5, hi + 0.5),
            Scale::Linear if from_zero => lo = lo.min(0.0),
            _ => {}
        }
        if hi - lo < 1e-12 {
            (lo, hi) = (lo - 0.5, hi + 0.5);
        }
        let pad = 0.05 * (hi - lo);
        (lo - pad, hi + pad)
    }

    fn label(&self, position: f64) -> String {
        let whole = (position - position.round()).abs() < 1e-6;
        let index = position.round();
        match &self.scale {
            Scale::Log => tick(10f64.powf(position), 2),
            Scale::Discrete if whole && index >= 0.0 => self
                .values
                .get(index as usize)
                .map_or(String::new(), |&v| tick(v, 4)),
            Scale::Named(names) if whole && index >= 0.0 => {
                names.get(index as usize).cloned().unwrap_or_default()
            }
            Scale::Discrete | Scale::Named(_) => String::new(),
            _ => tick(position, 3),
        }
    }

    /// The axis title, saying when it is logarithmic, or categorical (its values evenly spaced
    /// whatever their distances).
    fn title(&self, label: &str) -> String {
        match self.scale {
            Scale::Log => format!("{label} (log scale)"),
            Scale::Discrete => format!("{label} (categories, evenly spaced)"),
            _ => label.to_owned(),
        }
    }
}

/// Writes an SVG line chart of one panel.
pub fn line_chart(path: &Path, chart: &Chart, series: Vec<Series>) -> Result<()> {
    panels(
        path,
        chart,
        &[Panel {
            name: String::new(),
            series,
        }],
    )
}

/// Most series one panel draws: a panel given more is drawn as small multiples of this many.
pub const MAX_SERIES_PER_PANEL: usize = 8;

/// Legend text's size in pixels, and an upper estimate of one character's width in it (sans-serif
/// glyphs are at most ~0.6 of the size wide, digits and lower case less).
const LEGEND_FONT: u32 = 13;
const LEGEND_CHAR_WIDTH: f64 = 0.62 * LEGEND_FONT as f64;
/// Pixels between legend entries, and above the first.
const LEGEND_STEP: u32 = 20;
const LEGEND_TOP: u32 = 30;

/// `panels` with every panel of more than [`MAX_SERIES_PER_PANEL`] series split into panels of at
/// most that many (named `NAME (1/3)`, …): small multiples on the same axes.
fn split_crowded(panels: &[Panel]) -> Vec<Panel> {
    let mut out = Vec::new();
    for panel in panels {
        let chunks: Vec<&[Series]> = panel.series.chunks(MAX_SERIES_PER_PANEL).collect();
        if chunks.len() <= 1 {
            out.push(panel.clone());
            continue;
        }
        for (i, chunk) in chunks.iter().enumerate() {
            let part = format!("{}/{}", i + 1, chunks.len());
            out.push(Panel {
                name: if panel.name.is_empty() {
                    format!("series {part}")
                } else {
                    format!("{} ({part})", panel.name)
                },
                series: chunk.to_vec(),
            });
        }
    }
    out
}

/// Writes an SVG figure of `panels` side by side in rows of up to three, one legend for all, every
/// label inside the canvas; a panel of more than [`MAX_SERIES_PER_PANEL`] series becomes several.
pub fn panels(path: &Path, chart: &Chart, panels: &[Panel]) -> Result<()> {
    let panels = &split_crowded(panels);
    let points = || {
        panels
            .iter()
            .flat_map(|p| &p.series)
            .flat_map(|s| &s.points)
    };
    if points().next().is_none() {
        return Err(anyhow!("{}: nothing to plot", path.display()));
    }
    let x = Placement::new(&chart.x.scale, points().map(|p| p.0));
    let y = Placement::new(&chart.y.scale, points().map(|p| p.1));
    let drawn_x: Vec<f64> = points().map(|p| x.place(p.0)).collect();
    let drawn_y: Vec<f64> = points().map(|p| y.place(p.1)).collect();
    let (x0, x1) = x.range(&drawn_x, false);
    let (y0, y1) = y.range(&drawn_y, true);
    // One entry per series name, in order of first appearance: the same look in every panel.
    let mut names: Vec<&str> = Vec::new();
    for s in panels.iter().flat_map(|p| &p.series) {
        if !names.contains(&s.name.as_str()) {
            names.push(&s.name);
        }
    }
    let columns = panels.len().min(3);
    let rows = panels.len().div_ceil(columns);
    // The legend's column is as wide as its longest name and the figure as tall as its entries:
    // nothing is drawn past the canvas.
    let longest = names.iter().map(|n| n.chars().count()).max().unwrap_or(0);
    let legend_width = 44 + (LEGEND_CHAR_WIDTH * longest as f64).ceil() as u32;
    let legend_height = LEGEND_TOP + LEGEND_STEP * names.len() as u32 + 40;
    let (panel_w, panel_h) = (if columns == 1 { 620 } else { 360 }, 320);
    let size = (
        panel_w * columns as u32 + legend_width.max(120),
        (40 + panel_h * rows as u32).max(legend_height),
    );
    let draw = |e: &dyn std::fmt::Display| anyhow!("{}: {e}", path.display());
    let root = SVGBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(|e| draw(&e))?;
    let root = root
        .titled(chart.title, ("sans-serif", 18))
        .map_err(|e| draw(&e))?;
    let (plots, legend) = root.split_horizontally(panel_w * columns as u32);
    let (plots, _) = plots.split_vertically(panel_h * rows as u32);
    let areas = plots.split_evenly((rows, columns));
    for (panel, area) in panels.iter().zip(&areas) {
        // A caption wider than its panel is set smaller, so that it stays inside.
        let fits = (f64::from(panel_w) - 20.0) / (0.62 * panel.name.chars().count().max(1) as f64);
        let caption_size = fits.floor().clamp(8.0, 14.0);
        let mut c = ChartBuilder::on(area)
            .caption(&panel.name, ("sans-serif", caption_size))
            .margin(10)
            .x_label_area_size(36)
            .y_label_area_size(72)
            .build_cartesian_2d(x0..x1, y0..y1)
            .map_err(|e| draw(&e))?;
        let discrete_ticks = match &x.scale {
            Scale::Discrete => Some(x.values.len()),
            Scale::Named(n) => Some(n.len()),
            _ => None,
        };
        c.configure_mesh()
            .x_desc(x.title(&chart.x.label))
            .y_desc(y.title(&chart.y.label))
            .x_labels(discrete_ticks.map_or(8, |n| n.clamp(2, 24) + 2))
            .x_label_formatter(&|v| x.label(*v))
            .y_label_formatter(&|v| y.label(*v))
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(|e| draw(&e))?;
        for s in &panel.series {
            let i = names.iter().position(|n| *n == s.name).unwrap_or(0);
            let (colour, _) = look(i);
            let placed: Vec<(f64, f64)> = s
                .points
                .iter()
                .map(|&(a, b)| (x.place(a), y.place(b)))
                .filter(|(a, b)| a.is_finite() && b.is_finite())
                .collect();
            c.draw_series(LineSeries::new(
                placed.iter().copied(),
                colour.stroke_width(2),
            ))
            .map_err(|e| draw(&e))?;
            c.draw_series(placed.iter().map(|&p| marker(p, i)))
                .map_err(|e| draw(&e))?;
        }
    }
    draw_legend(&legend, &names).map_err(|e| draw(&e))?;
    root.present().map_err(|e| draw(&e))?;
    Ok(())
}

/// The series' names with their line and marker, one a line, beside the plots.
fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    names: &[&str],
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    for (i, name) in names.iter().enumerate() {
        let (colour, _) = look(i);
        let y = (LEGEND_TOP + LEGEND_STEP * i as u32) as i32;
        area.draw(&PathElement::new(
            vec![(8, y), (28, y)],
            colour.stroke_width(2),
        ))?;
        area.draw(&marker((18, y), i))?;
        area.draw(&Text::new(
            name.to_string(),
            (34, y - 7),
            ("sans-serif", LEGEND_FONT).into_font(),
        ))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discrete_axes_label_only_their_values_and_wide_spans_go_log() {
        let ranks = Placement::new(&Scale::Discrete, [1.0, 2.0, 8.0, 2.0].into_iter());
        assert_eq!(ranks.place(8.0), 2.0);
        assert_eq!(
            [0.0, 0.5, 1.0, 2.0].map(|p| ranks.label(p)),
            ["1", "", "2", "8"].map(String::from)
        );
        let seconds = Placement::new(&Scale::Auto, [0.001, 0.5, 2.0].into_iter());
        assert_eq!(seconds.scale, Scale::Log);
        assert_eq!(seconds.label(-3.0), "0.001");
        assert_eq!(
            [tick(256.0, 4), tick(0.0070, 3), tick(1.25, 3)],
            ["256", "0.007", "1.25"]
        );
        let speedups = Placement::new(&Scale::Auto, [1.0, 1.5, 1.9].into_iter());
        assert_eq!(speedups.scale, Scale::Linear);
        // A log axis of values that are not all positive falls back to linear.
        assert_eq!(
            Placement::new(&Scale::Log, [0.0, 3.0].into_iter()).scale,
            Scale::Linear
        );
    }

    #[test]
    fn a_faceted_figure_is_written() {
        let dir = std::env::temp_dir().join(format!("ringbench-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut map = BTreeMap::new();
        for panel in ["c=1024", "c=16384"] {
            for (s, k) in [("zigzag", 1.0), ("striped", 0.9)] {
                map.insert(
                    (panel.to_owned(), s.to_owned()),
                    vec![(2.0, 1.5 * k), (4.0, 1.75 * k), (8.0, 1.875 * k)],
                );
            }
        }
        let chart = Chart {
            title: "speedup",
            x: Axis::new("ranks N", Scale::Discrete),
            y: Axis::new("speedup", Scale::Auto),
        };
        let path = dir.join("f.svg");
        panels(&path, &chart, &Panel::grouped(map)).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.contains("c=16384") && svg.contains("zigzag"));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
