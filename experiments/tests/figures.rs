//! Figures people can read: every text of every committed SVG figure under `results/` (titles, tick
//! labels, legend entries) lies inside its canvas, and a crowded chart drawn now (18 series with
//! long names, on a categorical axis) keeps at most 8 series a panel, its legend inside, and says
//! that its axis is categorical.

use experiments::plot::{Axis, Chart, MAX_SERIES_PER_PANEL, Scale, Series, line_chart};
use std::path::{Path, PathBuf};

/// The repository root.
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The value of attribute `name` in an element's attribute text.
fn attribute<'a>(attributes: &'a str, name: &str) -> Option<&'a str> {
    let start = attributes.find(&format!(" {name}=\""))? + name.len() + 3;
    let end = attributes[start..].find('"')? + start;
    Some(&attributes[start..end])
}

/// Each text element's (content, x, y, font size, anchor, rotated) in an SVG.
fn texts(svg: &str) -> Vec<(String, f64, f64, f64, String, bool)> {
    let mut found = Vec::new();
    let mut rest = svg;
    while let Some(open) = rest.find("<text") {
        let after = &rest[open + 5..];
        let close = after.find('>').unwrap();
        let attributes = &after[..close];
        let end = after.find("</text>").unwrap();
        let content = after[close + 1..end].trim().to_owned();
        let number = |name: &str| attribute(attributes, name).map_or(0.0, |v| v.parse().unwrap());
        found.push((
            content,
            number("x"),
            number("y"),
            attribute(attributes, "font-size").map_or(12.0, |v| v.parse().unwrap()),
            attribute(attributes, "text-anchor")
                .unwrap_or("start")
                .to_owned(),
            attributes.contains("rotate("),
        ));
        rest = &after[end..];
    }
    found
}

/// The texts of `svg` that reach past its canvas, each as `"TEXT" at (x, y)`: a text's width is
/// estimated from above as 0.62 of its font size a character (sans-serif glyphs are narrower).
fn outside(svg: &str) -> Vec<String> {
    let size = |name: &str| -> f64 {
        let head = &svg[svg.find("<svg").unwrap()..];
        attribute(&head[..head.find('>').unwrap()], name)
            .unwrap()
            .parse()
            .unwrap()
    };
    let (width, height) = (size("width"), size("height"));
    texts(svg)
        .into_iter()
        .filter(|(text, x, y, font, anchor, rotated)| {
            if text.is_empty() {
                return false;
            }
            let length = 0.62 * font * text.chars().count() as f64;
            let left = match anchor.as_str() {
                "end" => x - length,
                "middle" => x - length / 2.0,
                _ => *x,
            };
            // A rotated label (the y axis title) runs along y: its extent is checked there.
            let (low, high, limit) = if *rotated {
                (y - length / 2.0, y + length / 2.0, height)
            } else {
                (left, left + length, width)
            };
            low < -0.5 || high > limit + 0.5 || *y < -0.5 || *y + font > height + 0.5
        })
        .map(|(text, x, y, ..)| format!("{text:?} at ({x}, {y})"))
        .collect()
}

/// Every `.svg` under `dir`.
fn figures(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            figures(&path, found);
        } else if path.extension().is_some_and(|e| e == "svg") {
            found.push(path);
        }
    }
}

#[test]
fn every_committed_figure_keeps_its_text_inside_the_canvas() {
    let mut found = Vec::new();
    figures(&workspace().join("results"), &mut found);
    assert!(
        found.len() >= 20,
        "only {} figures under results/",
        found.len()
    );
    let bad: Vec<String> = found
        .iter()
        .filter_map(|path| {
            let outside = outside(&std::fs::read_to_string(path).unwrap());
            (!outside.is_empty()).then(|| format!("{}: {}", path.display(), outside.join("; ")))
        })
        .collect();
    assert!(bad.is_empty(), "text past the canvas:\n{}", bad.join("\n"));
}

#[test]
fn a_crowded_chart_becomes_small_multiples_with_its_legend_inside() {
    let dir = std::env::temp_dir().join(format!("ringbench-figures-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let series: Vec<Series> = (0..18)
        .map(|i| Series {
            name: format!("strategy=zigzag forward=cw backward=kv-reverse kernel=fused run {i}"),
            points: [64.0, 128.0, 512.0, 4096.0]
                .iter()
                .map(|&x| (x, 1.0 + f64::from(i) * 0.1 + x / 4096.0))
                .collect(),
        })
        .collect();
    let chart = Chart {
        title: "eighteen series",
        x: Axis::new("block size", Scale::Discrete),
        y: Axis::new("loss", Scale::Linear),
    };
    let path = dir.join("crowded.svg");
    line_chart(&path, &chart, series).unwrap();
    let svg = std::fs::read_to_string(&path).unwrap();
    assert_eq!(outside(&svg), Vec::<String>::new());
    // 18 series: three panels of at most 8.
    let captions: Vec<String> = texts(&svg)
        .into_iter()
        .map(|t| t.0)
        .filter(|t| t.starts_with("series "))
        .collect();
    assert_eq!(captions, ["series 1/3", "series 2/3", "series 3/3"]);
    assert_eq!(18usize.div_ceil(MAX_SERIES_PER_PANEL), 3);
    // Every legend entry is written once, and the categorical axis says so.
    let all: Vec<String> = texts(&svg).into_iter().map(|t| t.0).collect();
    for i in 0..18 {
        let entry = format!("strategy=zigzag forward=cw backward=kv-reverse kernel=fused run {i}");
        assert_eq!(all.iter().filter(|t| **t == entry).count(), 1, "{entry}");
    }
    assert!(svg.contains("block size (categories, evenly spaced)"));
    std::fs::remove_dir_all(dir).unwrap();
}
