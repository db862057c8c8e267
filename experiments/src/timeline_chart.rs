//! SVG timelines of ring passes: one row per rank holding its tile computes, its waits for blocks
//! (the exposed communication) and its sends on one time axis, one panel per configuration stacked
//! under each other. Lanes come from a recorded trace (measured) or from the simulator's schedule
//! (modelled), and travel as rows of a side CSV so that a figure is drawn again from its table.

use crate::results::{Record, Table};
use anyhow::{Result, anyhow};
use plotters::prelude::*;
use std::path::Path;
use workbench::trace::{Event, Track};

/// What a bar shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BarKind {
    /// A tile computed.
    Compute,
    /// Blocked waiting for a block: communication the compute did not hide.
    Wait,
    /// A block sent (measured: the post; simulated: its time on the link).
    Send,
}

impl BarKind {
    const ALL: [BarKind; 3] = [BarKind::Compute, BarKind::Wait, BarKind::Send];

    /// Its name in the side CSV.
    pub fn name(self) -> &'static str {
        match self {
            BarKind::Compute => "compute",
            BarKind::Wait => "wait",
            BarKind::Send => "send",
        }
    }

    fn legend(self) -> &'static str {
        match self {
            BarKind::Compute => "tile computed",
            BarKind::Wait => "waiting for a block (exposed communication)",
            BarKind::Send => "block sent (measured: its post; simulated: its time on the link)",
        }
    }

    fn colour(self) -> RGBColor {
        match self {
            BarKind::Compute => RGBColor(31, 119, 180),
            BarKind::Wait => RGBColor(214, 39, 40),
            BarKind::Send => RGBColor(150, 150, 150),
        }
    }

    /// The bar's band within its rank's row (0 the row's top, 1 its bottom): compute, then waits,
    /// then sends.
    fn band(self) -> (f64, f64) {
        match self {
            BarKind::Compute => (0.08, 0.4),
            BarKind::Wait => (0.42, 0.66),
            BarKind::Send => (0.68, 0.92),
        }
    }
}

/// One bar of a rank's row.
#[derive(Debug, Clone, PartialEq)]
pub struct Bar {
    /// The rank.
    pub rank: usize,
    /// What it shows.
    pub kind: BarKind,
    /// Its start, ms after the pass began.
    pub start_ms: f64,
    /// Its length, ms.
    pub dur_ms: f64,
}

/// One pass drawn as a panel: a row per rank.
#[derive(Debug, Clone, PartialEq)]
pub struct Lanes {
    /// The panel's caption.
    pub name: String,
    /// Rows drawn (ranks 0..ranks).
    pub ranks: usize,
    /// Every bar.
    pub bars: Vec<Bar>,
}

impl Lanes {
    /// The lanes of a recorded pass of `ranks` ranks: the compute track's tiles, the ring track's
    /// waits and sends (other events, and ranks past `ranks`, left out), timed from the first.
    pub fn of_trace(name: String, ranks: usize, events: &[Event]) -> Lanes {
        let kind = |e: &Event| match e.track {
            Track::Compute => Some(BarKind::Compute),
            Track::Ring if e.name.starts_with("wait") => Some(BarKind::Wait),
            Track::Ring if e.name.starts_with("send") => Some(BarKind::Send),
            _ => None,
        };
        let kept: Vec<(&Event, BarKind)> = events
            .iter()
            .filter(|e| e.pid < ranks)
            .filter_map(|e| kind(e).map(|k| (e, k)))
            .collect();
        let origin = kept.iter().map(|(e, _)| e.ts).fold(f64::INFINITY, f64::min);
        let bars = kept
            .iter()
            .map(|(e, kind)| Bar {
                rank: e.pid,
                kind: *kind,
                start_ms: (e.ts - origin) / 1e3,
                dur_ms: e.dur / 1e3,
            })
            .collect();
        Lanes { name, ranks, bars }
    }

    /// The lanes of a simulated pass: rank r computes `compute[r][s]` seconds from `starts[r][s]`
    /// (`ring_time::step_starts`), waits from the end of one step to the start of the next, and
    /// the block it held at step s is on the link for `link_seconds` from that step's start.
    pub fn of_schedule(
        name: String,
        compute: &[Vec<f64>],
        starts: &[Vec<f64>],
        link_seconds: f64,
    ) -> Lanes {
        let mut bars = Vec::new();
        for (rank, (work, at)) in compute.iter().zip(starts).enumerate() {
            for (s, (&w, &t)) in work.iter().zip(at).enumerate() {
                let bar = |kind, start: f64, dur: f64| Bar {
                    rank,
                    kind,
                    start_ms: start * 1e3,
                    dur_ms: dur * 1e3,
                };
                bars.push(bar(BarKind::Compute, t, w));
                if let Some(&next) = at.get(s + 1) {
                    bars.push(bar(BarKind::Send, t, link_seconds));
                    if next > t + w {
                        bars.push(bar(BarKind::Wait, t + w, next - t - w));
                    }
                }
            }
        }
        Lanes {
            name,
            ranks: compute.len(),
            bars,
        }
    }

    /// The lanes as side-CSV rows, each `key`'s cells then the panel, rank, kind and times.
    pub fn records(&self, key: &Record) -> Vec<Record> {
        self.bars
            .iter()
            .map(|b| {
                let mut r = key.clone();
                let cells = [
                    ("panel", self.name.clone()),
                    ("ranks_drawn", self.ranks.to_string()),
                    ("rank", b.rank.to_string()),
                    ("kind", b.kind.name().to_owned()),
                    ("start_ms", b.start_ms.to_string()),
                    ("dur_ms", b.dur_ms.to_string()),
                ];
                r.0.extend(cells.map(|(c, v)| (c.to_owned(), v)));
                r
            })
            .collect()
    }

    /// The panels of a side CSV, in order of first appearance; a row of no known kind is an error
    /// naming it.
    pub fn from_table(table: &Table) -> Result<Vec<Lanes>> {
        let mut panels: Vec<Lanes> = Vec::new();
        for row in &table.rows {
            let name = row.get("panel").unwrap_or("").to_owned();
            let kind = row.get("kind").unwrap_or("");
            let kind = BarKind::ALL
                .into_iter()
                .find(|k| k.name() == kind)
                .ok_or_else(|| anyhow!("a timeline row of kind {kind:?} (panel {name:?})"))?;
            let i = match panels.iter().position(|p| p.name == name) {
                Some(i) => i,
                None => {
                    panels.push(Lanes {
                        name,
                        ranks: row.num("ranks_drawn") as usize,
                        bars: Vec::new(),
                    });
                    panels.len() - 1
                }
            };
            panels[i].bars.push(Bar {
                rank: row.num("rank") as usize,
                kind,
                start_ms: row.num("start_ms"),
                dur_ms: row.num("dur_ms"),
            });
        }
        Ok(panels)
    }

    /// The share of the ranks' compute and wait time spent waiting, over every rank (for captions).
    pub fn wait_share(&self) -> f64 {
        // A fold from +0 (an empty `sum` of floats is −0, printed "-0%").
        let total = |k: BarKind| -> f64 {
            (self.bars.iter())
                .filter(|b| b.kind == k)
                .fold(0.0, |t, b| t + b.dur_ms)
        };
        let (wait, compute) = (total(BarKind::Wait), total(BarKind::Compute));
        wait / (wait + compute)
    }
}

/// Draws the panels a kind keeps in its side table `dir/table` as `dir/svg`; nothing when the
/// table is absent or empty (a table computed before timelines were drawn).
pub fn draw_side_table(dir: &Path, table: &str, svg: &str, title: &str) -> Result<()> {
    let panels = Lanes::from_table(&Table::read(&dir.join(table))?)?;
    if panels.is_empty() {
        return Ok(());
    }
    draw(&dir.join(svg), title, &panels)
}

/// Keeps `lanes` in the side table `path` under `key` (replacing that key's earlier bars).
pub fn save(path: &Path, key: &Record, lanes: &[Lanes]) -> Result<()> {
    let mut table = Table::read(path)?;
    table.replace(key, lanes.iter().flat_map(|l| l.records(key)).collect());
    table.write_csv(path)
}

/// Pixels of one rank's row, of a panel's caption and axis, and of the figure's width.
const ROW: u32 = 30;
const PANEL_EXTRA: u32 = 86;
const WIDTH: u32 = 980;
const LEGEND: u32 = 56;

/// Writes `panels` as one SVG figure, stacked, each on its own time axis (ms).
pub fn draw(path: &Path, title: &str, panels: &[Lanes]) -> Result<()> {
    if panels.iter().all(|p| p.bars.is_empty()) {
        return Err(anyhow!("{}: no timeline to draw", path.display()));
    }
    // A bar with no place on the axis is an error, not a bar the axis's range leaves out.
    for panel in panels {
        if let Some(b) =
            (panel.bars.iter()).find(|b| !(b.start_ms.is_finite() && b.dur_ms.is_finite()))
        {
            return Err(anyhow!(
                "{}: panel {:?}: rank {}'s {} bar starts at {} ms and lasts {} ms",
                path.display(),
                panel.name,
                b.rank,
                b.kind.name(),
                b.start_ms,
                b.dur_ms
            ));
        }
    }
    let heights: Vec<u32> = panels
        .iter()
        .map(|p| PANEL_EXTRA + ROW * p.ranks.max(1) as u32)
        .collect();
    let size = (WIDTH, 40 + LEGEND + heights.iter().sum::<u32>());
    let draw = |e: &dyn std::fmt::Display| anyhow!("{}: {e}", path.display());
    let root = SVGBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(|e| draw(&e))?;
    let root = root
        .titled(title, ("sans-serif", 18))
        .map_err(|e| draw(&e))?;
    let (legend, mut rest) = root.split_vertically(LEGEND);
    let mut x = 20;
    for kind in BarKind::ALL {
        legend
            .draw(&Rectangle::new(
                [(x, 14), (x + 22, 28)],
                kind.colour().filled(),
            ))
            .map_err(|e| draw(&e))?;
        legend
            .draw(&Text::new(
                kind.legend(),
                (x + 28, 14),
                ("sans-serif", 12).into_font(),
            ))
            .map_err(|e| draw(&e))?;
        x += 28 + (6.4 * kind.legend().chars().count() as f64) as i32 + 24;
    }
    for (panel, height) in panels.iter().zip(&heights) {
        let (area, below) = rest.split_vertically(*height);
        rest = below;
        let end = panel
            .bars
            .iter()
            .map(|b| b.start_ms + b.dur_ms)
            .fold(0.0, f64::max)
            .max(1e-6);
        let rows = panel.ranks.max(1) as f64;
        let mut c = ChartBuilder::on(&area)
            .caption(&panel.name, ("sans-serif", 14))
            .margin(8)
            .x_label_area_size(34)
            .y_label_area_size(64)
            .build_cartesian_2d(0.0..end * 1.01, rows..0.0)
            .map_err(|e| draw(&e))?;
        c.configure_mesh()
            .x_desc("ms since the pass began")
            .disable_y_mesh()
            .y_label_formatter(&|_| String::new())
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(|e| draw(&e))?;
        // Each row's name at its middle, left of the axis.
        let (base_x, base_y) = area.get_base_pixel();
        for rank in 0..panel.ranks {
            let (x, y) = c.backend_coord(&(0.0, rank as f64 + 0.5));
            area.draw(&Text::new(
                format!("rank {rank}"),
                (x - base_x - 56, y - base_y - 6),
                ("sans-serif", 12).into_font(),
            ))
            .map_err(|e| draw(&e))?;
        }
        for kind in BarKind::ALL {
            let (top, bottom) = kind.band();
            let corners = panel.bars.iter().filter(|b| b.kind == kind).map(|b| {
                let row = b.rank as f64;
                // A bar too short to see is drawn a pixel wide (a send post is microseconds).
                let dur = b.dur_ms.max(end / f64::from(WIDTH));
                [(b.start_ms, row + top), (b.start_ms + dur, row + bottom)]
            });
            // Filled, then outlined in white so that bars that touch stay apart.
            c.draw_series(
                corners
                    .clone()
                    .map(|at| Rectangle::new(at, kind.colour().filled())),
            )
            .map_err(|e| draw(&e))?;
            c.draw_series(corners.map(|at| Rectangle::new(at, WHITE.stroke_width(1))))
                .map_err(|e| draw(&e))?;
        }
    }
    root.present().map_err(|e| draw(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_simulated_pass_waits_where_the_link_is_slower_than_the_tile() {
        let compute = vec![vec![1.0; 3]; 2];
        let starts = strategies::ring_time::step_starts(&compute, 3.0);
        let lanes = Lanes::of_schedule("slow link".into(), &compute, &starts, 3.0);
        // Each rank: 3 tiles, 2 sends, 2 waits of 2 s (3 s on the link less 1 s of compute).
        let waits: Vec<f64> = lanes
            .bars
            .iter()
            .filter(|b| b.kind == BarKind::Wait)
            .map(|b| b.dur_ms)
            .collect();
        assert_eq!(waits, vec![2000.0; 4]);
        // 8 s of waiting beside 6 s of tiles.
        assert!((lanes.wait_share() - 8.0 / 14.0).abs() < 1e-12);
        // Through the side CSV and back unchanged; drawn.
        let key = Record::new([("block_size", 64)]);
        let back = Lanes::from_table(&Table::of(lanes.records(&key))).unwrap();
        assert_eq!(back, vec![lanes.clone()]);
        let fast = Lanes::of_schedule(
            "fast link".into(),
            &compute,
            &strategies::ring_time::step_starts(&compute, 0.5),
            0.5,
        );
        assert_eq!(fast.wait_share(), 0.0);
        let path = std::env::temp_dir().join(format!("ringbench-lanes-{}.svg", std::process::id()));
        draw(&path, "two passes", &[lanes, fast.clone()]).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.contains("slow link") && svg.contains("rank 1"), "{svg}");
        std::fs::remove_file(&path).unwrap();
        let mut broken = fast.clone();
        broken.bars[3].dur_ms = f64::NAN;
        let err = draw(&path, "NaN", &[broken]).unwrap_err().to_string();
        assert!(err.contains("lasts NaN ms"), "{err}");
    }
}
