//! `kart plot`: a training run's metrics JSON lines drawn as a PNG of four panels over `step`
//! (training reward, evaluation exact match, KL to the reference policy, tool calls per
//! trajectory). The font is bundled, so no system font libraries are needed.

use kart_train::record::{Key, keys};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

/// The panels, left to right and top to bottom: metric key, title and line colour.
pub const PANELS: [(Key, &str, RGBColor); 4] = [
    (keys::REWARD_MEAN, "training reward", RGBColor(31, 119, 180)),
    (keys::EVAL_EXACT_MATCH, "evaluation exact match", RGBColor(44, 160, 44)),
    (keys::ACTOR_KL, "KL to the reference policy", RGBColor(214, 39, 40)),
    (keys::TOOL_CALLS, "tool calls per trajectory", RGBColor(148, 103, 189)),
];

/// Size of the PNG in pixels.
pub const SIZE: (u32, u32) = (1200, 800);

/// The bundled font (DejaVu Sans; license in `crates/kart/assets/fonts/LICENSE.txt`).
const FONT: &[u8] = include_bytes!("../assets/fonts/DejaVuSans.ttf");

/// The font family the charts ask for; the bundled font is registered under it.
const FAMILY: &str = "sans-serif";

/// Why the metrics cannot be plotted.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("{}: {source}", file.display())]
    Io { file: PathBuf, source: std::io::Error },
    /// A malformed line of the metrics file (numbered from 1).
    #[error("{}: line {line}: {reason}", file.display())]
    Line { file: PathBuf, line: usize, reason: String },
    #[error("{}: drawing failed: {reason}", file.display())]
    Draw { file: PathBuf, reason: String },
}

/// The points `(step, value)` of each of [`PANELS`]' metrics in `file`, in file order. A line
/// without a metric (or with `null`) adds no point to its panel; a line that is not a JSON object
/// with a numeric `step`, or has a non-numeric metric, is an error naming the line.
pub fn read_metrics(file: &Path) -> Result<[Vec<(f64, f64)>; 4], PlotError> {
    let io = |source| PlotError::Io { file: file.to_owned(), source };
    let mut series: [Vec<(f64, f64)>; 4] = Default::default();
    for (i, line) in BufReader::new(std::fs::File::open(file).map_err(io)?).lines().enumerate() {
        let line = line.map_err(io)?;
        if line.trim().is_empty() {
            continue;
        }
        let bad = |reason: String| PlotError::Line { file: file.to_owned(), line: i + 1, reason };
        let row: Value = serde_json::from_str(&line).map_err(|e| bad(format!("not JSON: {e}")))?;
        let step = row
            .get(keys::STEP.name())
            .and_then(Value::as_f64)
            .ok_or_else(|| bad("no numeric `step`".into()))?;
        for ((key, ..), points) in PANELS.iter().zip(&mut series) {
            let key = key.name();
            match row.get(key) {
                None | Some(Value::Null) => {}
                Some(v) => points
                    .push((step, v.as_f64().ok_or_else(|| bad(format!("`{key}` = {v} is not a number")))?)),
            }
        }
    }
    Ok(series)
}

/// Plots the metrics of `metrics` into the PNG `out` (2x2 panels; "no data" where a metric never
/// appears) and returns the points per panel.
pub fn plot_metrics(metrics: &Path, out: &Path) -> Result<[usize; 4], PlotError> {
    let series = read_metrics(metrics)?;
    let draw_error = |reason: String| PlotError::Draw { file: out.to_owned(), reason };
    plotters::style::register_font(FAMILY, FontStyle::Normal, FONT)
        .map_err(|_| draw_error("the bundled font is invalid".into()))?;
    let root = BitMapBackend::new(out, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| draw_error(e.to_string()))?;
    for (area, ((key, title, color), points)) in
        root.split_evenly((2, 2)).iter().zip(PANELS.iter().zip(&series))
    {
        panel(area, &format!("{title} ({key})"), *color, points).map_err(|e| draw_error(e.to_string()))?;
    }
    root.present().map_err(|e| draw_error(e.to_string()))?;
    Ok(series.each_ref().map(Vec::len))
}

type DrawResult = Result<(), DrawingAreaErrorKind<<BitMapBackend<'static> as DrawingBackend>::ErrorType>>;

/// One panel: `points` as a line with markers, or "no data".
fn panel(
    area: &DrawingArea<BitMapBackend<'_>, Shift>,
    title: &str,
    color: RGBColor,
    points: &[(f64, f64)],
) -> DrawResult {
    if points.is_empty() {
        let area = area.titled(title, (FAMILY, 22))?;
        let (w, h) = area.dim_in_pixel();
        let style = TextStyle::from((FAMILY, 20))
            .color(&RGBColor(128, 128, 128))
            .pos(Pos::new(HPos::Center, VPos::Center));
        return area.draw(&Text::new("no data", (w as i32 / 2, h as i32 / 2), style));
    }
    let mut chart = ChartBuilder::on(area)
        .caption(title, (FAMILY, 22))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(60)
        .build_cartesian_2d(padded(points.iter().map(|p| p.0)), padded(points.iter().map(|p| p.1)))?;
    chart
        .configure_mesh()
        .x_desc("step")
        .x_label_formatter(&tick)
        .label_style((FAMILY, 14))
        .axis_desc_style((FAMILY, 16))
        .draw()?;
    chart.draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)))?;
    chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
    Ok(())
}

/// The range of `values` widened by 5% on each side (10% around a single value).
fn padded(values: impl Iterator<Item = f64>) -> std::ops::Range<f64> {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let pad = match (hi > lo, lo != 0.0) {
        (true, _) => (hi - lo) * 0.05,
        (false, true) => lo.abs() * 0.1,
        (false, false) => 1.0,
    };
    lo - pad..hi + pad
}

/// A step tick: at most three decimals, without trailing zeros.
fn tick(x: &f64) -> String {
    let text = format!("{x:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pixels of `color` in the quadrant (`col`, `row`) of an RGB image `width` pixels wide.
    fn count(
        rgb: &[u8],
        (width, height): (usize, usize),
        (col, row): (usize, usize),
        color: RGBColor,
    ) -> usize {
        let (qw, qh) = (width / 2, height / 2);
        (row * qh..(row + 1) * qh)
            .flat_map(|y| (col * qw..(col + 1) * qw).map(move |x| (y * width + x) * 3))
            .filter(|&i| rgb[i..i + 3] == [color.0, color.1, color.2])
            .count()
    }

    #[test]
    fn plots_present_metrics_and_marks_missing_ones() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = dir.path().join("metrics.jsonl");
        let mut lines = Vec::new();
        for step in 1..=20 {
            let mut row = serde_json::json!({"step": step, "reward/mean": 0.02 * f64::from(step), "actor/kl": 0.001 * f64::from(step), "loss": 1.0});
            if step % 5 == 0 {
                row["eval/exact_match"] = serde_json::json!(0.01 * f64::from(step));
            }
            lines.push(row.to_string());
        }
        std::fs::write(&metrics, lines.join("\n") + "\n\n").unwrap();
        let out = dir.path().join("run.png");
        assert_eq!(plot_metrics(&metrics, &out).unwrap(), [20, 4, 20, 0]);

        let decoder = png::Decoder::new(std::fs::File::open(&out).unwrap());
        let mut reader = decoder.read_info().unwrap();
        let mut rgb = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut rgb).unwrap();
        assert_eq!((info.width, info.height, info.color_type), (SIZE.0, SIZE.1, png::ColorType::Rgb));
        let size = (SIZE.0 as usize, SIZE.1 as usize);
        // Each metric's line is drawn in its own panel; the panel without data has none of its colour.
        for (i, (key, _, color)) in PANELS.iter().enumerate() {
            let pixels = count(&rgb, size, (i % 2, i / 2), *color);
            if i < 3 {
                assert!(pixels > 100, "{key}: {pixels} pixels");
            } else {
                assert_eq!(pixels, 0, "{key}");
            }
        }
        // The "no data" panel is not blank: it has its title and the message.
        assert!(count(&rgb, size, (1, 1), WHITE) < size.0 * size.1 / 4);
    }

    #[test]
    fn ranges_and_ticks_read_well() {
        assert_eq!(padded([1.0, 3.0].into_iter()), 0.9..3.1);
        assert_eq!(padded([0.5].into_iter()), 0.45..0.55);
        assert_eq!(padded([0.0].into_iter()), -1.0..1.0);
        assert_eq!([tick(&2.0), tick(&1.8500000000000003), tick(&0.25)], ["2", "1.85", "0.25"]);
    }

    #[test]
    fn malformed_lines_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = dir.path().join("metrics.jsonl");
        let out = dir.path().join("out.png");
        let cases = [
            ("{\"step\": 1}\n{\"step\": 2,", "line 2: not JSON"),
            ("{\"step\": 1}\n\n{\"reward/mean\": 1}", "line 3: no numeric `step`"),
            ("{\"step\": 1, \"actor/kl\": \"high\"}", "line 1: `actor/kl` = \"high\" is not a number"),
        ];
        for (text, expected) in cases {
            std::fs::write(&metrics, text).unwrap();
            let e = plot_metrics(&metrics, &out).unwrap_err().to_string();
            assert!(e.contains(expected), "{e}");
        }
        assert!(!out.exists());
        let e = plot_metrics(&dir.path().join("none.jsonl"), &out).unwrap_err();
        assert!(matches!(e, PlotError::Io { .. }), "{e}");
    }
}
