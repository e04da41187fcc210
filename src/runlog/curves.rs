//! A run's curves as images, drawn from `metrics.jsonl` into `curves/` in
//! the run folder: `overview.png` (and `.svg`), one page with the run's
//! main charts (loss or reward first), then one chart a scalar,
//! `NAME.png` and `NAME.svg`.
//!
//! A scalar `X` and its evaluation counterpart `eval_X` share a chart
//! (`loss` with `eval_loss`); `epoch` and `skipped_steps` are bookkeeping
//! and get none, nor does a scalar that never changed over several steps
//! (`world_size`, a fixed temperature) unless the run is judged by it
//! (loss, reward, accuracy). Text is set in DejaVu Sans compiled into the binary
//! (plotters' `ab_glyph` backend), so the images look the same on a
//! machine without fonts. Files are written beside and renamed into place.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{Context, anyhow};
use plotters::coord::Shift;
use plotters::prelude::*;

use super::Record;

/// Folder of the images, in the run folder.
pub const CURVES_DIR: &str = "curves";

/// Scalars that are not worth a chart.
const SKIP: [&str; 2] = ["epoch", "skipped_steps"];

/// The overview page's file stem.
pub const OVERVIEW: &str = "overview";

/// The charts the overview shows first, when the run logged them: what a
/// run is judged by (loss, reward, accuracy), then its health.
const HEADLINE: [&str; 12] = [
    "loss",
    "reward",
    "accuracy",
    "rewards_margins",
    "rewards_accuracies",
    "kl",
    "entropy",
    "grad_norm",
    "lr",
    "response_tokens_mean",
    "tokens_per_s",
    "time_step_s",
];

/// Charts on the overview page, in rows of [`OVERVIEW_COLUMNS`].
const OVERVIEW_CHARTS: usize = 6;
const OVERVIEW_COLUMNS: usize = 3;

const SIZE: (u32, u32) = (800, 450);
/// The family name DejaVu Sans is registered under ([`register_font`]).
pub(crate) const FONT: &str = "sans-serif";
pub(crate) const COLORS: [RGBColor; 5] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
];

/// A named series of `(step, value)` points.
pub type Series = (String, Vec<(f64, f64)>);

/// One chart: its name and its series.
pub type Chart = (String, Vec<Series>);

/// The charts `records` make, by name.
pub fn charts(records: &[Record]) -> Vec<Chart> {
    let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for r in records {
        for (k, &v) in &r.values {
            if v.is_finite() && !SKIP.contains(&k.as_str()) {
                series
                    .entry(k.clone())
                    .or_default()
                    .push((r.step as f64, v));
            }
        }
    }
    let mut charts: BTreeMap<String, Vec<Series>> = BTreeMap::new();
    for (name, points) in series {
        // A scalar that stayed put over several steps says nothing as a
        // curve, unless a run is judged by it (a reward stuck at 0 is news).
        let judged = HEADLINE[..5].contains(&name.as_str());
        if !judged && points.len() > 1 && points.iter().all(|p| p.1 == points[0].1) {
            continue;
        }
        let chart = name.strip_prefix("eval_").unwrap_or(&name).to_owned();
        charts.entry(chart).or_default().push((name, points));
    }
    for lines in charts.values_mut() {
        // The training series first, its eval series after.
        lines.sort_by_key(|(n, _)| n.starts_with("eval_"));
    }
    charts.into_iter().collect()
}

/// A chart's file name: a scalar's name with the characters a file name
/// cannot hold (`/` of RL's `accuracy/output_lines=1`) made `_`.
fn file_stem(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '=' | '+') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The overview's charts: the [`HEADLINE`] ones the run has, in that
/// order, then others by name, at most [`OVERVIEW_CHARTS`].
pub fn overview(charts: &[Chart]) -> Vec<&Chart> {
    let mut picked: Vec<&Chart> = HEADLINE
        .iter()
        .filter_map(|h| charts.iter().find(|(n, _)| n == h))
        .collect();
    for c in charts {
        if !picked.iter().any(|p| p.0 == c.0) {
            picked.push(c);
        }
    }
    picked.truncate(OVERVIEW_CHARTS);
    picked
}

/// Draws `picked` on one page, [`OVERVIEW_COLUMNS`] a row.
fn overview_on<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    picked: &[&Chart],
    rows: usize,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    area.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    for (cell, (name, lines)) in area
        .split_evenly((rows, OVERVIEW_COLUMNS))
        .iter()
        .zip(picked)
    {
        chart_on(cell, name, lines)?;
    }
    Ok(())
}

/// Draws every chart of `records` into `run_dir/curves/`, the overview
/// first; returns the files written.
pub fn draw(run_dir: &Path, records: &[Record]) -> anyhow::Result<Vec<PathBuf>> {
    register_font()?;
    let dir = run_dir.join(CURVES_DIR);
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("cannot create folder `{}`", dir.display()))?;
    let mut written = Vec::new();
    let all = charts(records);
    let picked = overview(&all);
    if !picked.is_empty() {
        let rows = picked.len().div_ceil(OVERVIEW_COLUMNS);
        let size = (SIZE.0 * OVERVIEW_COLUMNS as u32, SIZE.1 * rows as u32);
        let png = dir.join(format!("{OVERVIEW}.png"));
        let tmp = dir.join(format!(".tmp-{OVERVIEW}.png"));
        {
            let area = BitMapBackend::new(&tmp, size).into_drawing_area();
            overview_on(&area, &picked, rows)
                .with_context(|| format!("cannot draw `{}`", png.display()))?;
        }
        std::fs::rename(&tmp, &png).with_context(|| format!("cannot write `{}`", png.display()))?;
        let svg = dir.join(format!("{OVERVIEW}.svg"));
        let mut text = String::new();
        {
            let area = SVGBackend::with_string(&mut text, size).into_drawing_area();
            overview_on(&area, &picked, rows)
                .with_context(|| format!("cannot draw `{}`", svg.display()))?;
        }
        crate::atomic::write(&svg, text.as_bytes())?;
        written.extend([png, svg]);
    }
    for (name, lines) in all {
        let file = file_stem(&name);
        let png = dir.join(format!("{file}.png"));
        // The image crate picks the format from the extension.
        let tmp = dir.join(format!(".tmp-{file}.png"));
        {
            let area = BitMapBackend::new(&tmp, SIZE).into_drawing_area();
            chart_on(&area, &name, &lines)
                .with_context(|| format!("cannot draw `{}`", png.display()))?;
        }
        std::fs::rename(&tmp, &png).with_context(|| format!("cannot write `{}`", png.display()))?;
        let svg = dir.join(format!("{file}.svg"));
        let mut text = String::new();
        {
            let area = SVGBackend::with_string(&mut text, SIZE).into_drawing_area();
            chart_on(&area, &name, &lines)
                .with_context(|| format!("cannot draw `{}`", svg.display()))?;
        }
        crate::atomic::write(&svg, text.as_bytes())?;
        written.extend([png, svg]);
    }
    Ok(written)
}

/// Registers the built-in DejaVu Sans as [`FONT`] (once a process).
pub(crate) fn register_font() -> anyhow::Result<()> {
    static DONE: OnceLock<bool> = OnceLock::new();
    let ok = *DONE.get_or_init(|| {
        plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular()).is_ok()
    });
    anyhow::ensure!(ok, "the built-in DejaVu Sans font did not load");
    Ok(())
}

fn chart_on<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    lines: &[Series],
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("{e}");
    area.fill(&WHITE).map_err(e)?;
    let points = || lines.iter().flat_map(|(_, p)| p.iter());
    let (mut x0, mut x1) = (f64::INFINITY, f64::NEG_INFINITY);
    let (mut y0, mut y1) = (f64::INFINITY, f64::NEG_INFINITY);
    for &(x, y) in points() {
        (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(y), y1.max(y));
    }
    if !x0.is_finite() {
        return Ok(());
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    let pad = if y1 > y0 {
        (y1 - y0) * 0.05
    } else {
        y0.abs().max(1.0) * 0.1
    };
    (y0, y1) = (y0 - pad, y1 + pad);
    let mut chart = ChartBuilder::on(area)
        .caption(title, (FONT, 24))
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc("step")
        // Steps are whole numbers: no ticks between them on short runs.
        .x_labels(((x1 - x0) as usize + 1).clamp(2, 10))
        .x_label_formatter(&|x| format!("{x:.0}"))
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 16))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(e)?;
    for (i, (name, pts)) in lines.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
            .map_err(e)?
            .label(name.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        // Sparse series (eval every N steps, a one-step run) show their points.
        if pts.len() < 50 {
            chart
                .draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))
                .map_err(e)?;
        }
    }
    chart
        .configure_series_labels()
        .label_font((FONT, 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(e)?;
    area.present().map_err(e)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records() -> Vec<Record> {
        (1..=20u64)
            .map(|s| Record {
                step: s,
                wall_time: None,
                values: [
                    ("loss".to_owned(), 3.0 / s as f64),
                    ("lr".to_owned(), 1e-3),
                    ("epoch".to_owned(), 0.0),
                ]
                .into_iter()
                .chain((s % 5 == 0).then(|| ("eval_loss".to_owned(), 2.5 / s as f64)))
                .collect(),
            })
            .collect()
    }

    #[test]
    fn eval_series_join_their_training_chart_and_bookkeeping_is_left_out() {
        let c = charts(&records());
        let names: Vec<(&str, Vec<&str>)> = c
            .iter()
            .map(|(n, l)| (n.as_str(), l.iter().map(|(s, _)| s.as_str()).collect()))
            .collect();
        // `lr` never changed: no chart.
        assert_eq!(names, vec![("loss", vec!["loss", "eval_loss"])]);
        assert_eq!(c[0].1[1].1.len(), 4);
    }

    #[test]
    fn the_overview_puts_what_a_run_is_judged_by_first() {
        let line = |n: &str| -> Chart { (n.to_owned(), vec![(n.to_owned(), vec![(1.0, 1.0)])]) };
        let all: Vec<Chart> = [
            "a_other",
            "entropy",
            "kl",
            "lr",
            "reward",
            "time_env_s",
            "z",
            "zz",
        ]
        .into_iter()
        .map(line)
        .collect();
        let names: Vec<&str> = overview(&all).iter().map(|c| c.0.as_str()).collect();
        assert_eq!(
            names,
            ["reward", "kl", "entropy", "lr", "a_other", "time_env_s"]
        );
    }

    #[test]
    fn draws_png_and_svg_with_text() {
        let dir = tempfile::tempdir().unwrap();
        let files = draw(dir.path(), &records()).unwrap();
        // The overview and the loss chart (with its eval series), each twice.
        assert_eq!(files.len(), 4);
        let page = std::fs::read(dir.path().join("curves/overview.png")).unwrap();
        assert_eq!(&page[..8], b"\x89PNG\r\n\x1a\n");
        let png = std::fs::read(dir.path().join("curves/loss.png")).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        let svg = std::fs::read_to_string(dir.path().join("curves/loss.svg")).unwrap();
        assert!(
            svg.contains("<svg") && svg.contains("eval_loss"),
            "{svg:.300}"
        );
        // No temp files left.
        let left: Vec<_> = std::fs::read_dir(dir.path().join("curves"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n.to_string_lossy().starts_with(".tmp"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn a_scalar_named_like_a_path_gets_one_flat_file() {
        let dir = tempfile::tempdir().unwrap();
        let r = vec![Record {
            step: 1,
            wall_time: None,
            values: [("accuracy/output_lines=1".to_owned(), 0.5)]
                .into_iter()
                .collect(),
        }];
        draw(dir.path(), &r).unwrap();
        assert!(
            dir.path()
                .join("curves/accuracy_output_lines=1.png")
                .is_file()
        );
    }

    #[test]
    fn the_title_is_drawn_without_system_fonts() {
        register_font().unwrap();
        let (w, h) = SIZE;
        let mut buf = vec![0u8; (w * h * 3) as usize];
        {
            let area = BitMapBackend::with_buffer(&mut buf, SIZE).into_drawing_area();
            chart_on(&area, "loss", &charts(&records())[0].1).unwrap();
        }
        // The caption's band, centre third: dark pixels where letters are.
        let dark = (4..34u32)
            .flat_map(|y| (w / 3..2 * w / 3).map(move |x| ((y * w + x) * 3) as usize))
            .filter(|&i| buf[i] < 128 && buf[i + 1] < 128 && buf[i + 2] < 128)
            .count();
        assert!(dark > 30, "{dark} dark pixels in the title band");
    }
}
