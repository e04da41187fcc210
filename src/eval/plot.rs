//! The picture of a comparison: per environment, each model's mean score
//! as a bar with its interval; with exactly two environments, beside it a
//! scatter of the models (one environment an axis, intervals as error
//! bars) with the Pareto rule's frontier drawn through its models. PNG, or
//! SVG when the file name ends in `.svg`.

use std::path::Path;

use anyhow::anyhow;
use plotters::coord::Shift;
use plotters::prelude::*;

use super::standings::Standings;
use crate::runlog::curves::{COLORS, FONT, register_font};

/// Draws `s` into `path`.
pub fn draw(s: &Standings, path: &Path) -> anyhow::Result<()> {
    register_font()?;
    let two = s.environments.len() == 2;
    let size = if two { (1300, 500) } else { (800, 500) };
    if path.extension().is_some_and(|e| e == "svg") {
        let mut text = String::new();
        {
            let area = SVGBackend::with_string(&mut text, size).into_drawing_area();
            draw_on(&area, s, two)?;
        }
        crate::atomic::write(path, text.as_bytes())
    } else {
        let tmp = path.with_file_name(format!(
            ".tmp-{}.png",
            path.file_stem()
                .map_or("plot".into(), |f| f.to_string_lossy())
        ));
        {
            let area = BitMapBackend::new(&tmp, size).into_drawing_area();
            draw_on(&area, s, two)?;
        }
        std::fs::rename(&tmp, path).map_err(|e| anyhow!("cannot write `{}`: {e}", path.display()))
    }
}

fn draw_on<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    s: &Standings,
    two: bool,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("{e}");
    area.fill(&WHITE).map_err(e)?;
    if two {
        let (left, right) = area.split_horizontally(700);
        bars(&left, s)?;
        scatter(&right, s)?;
    } else {
        bars(area, s)?;
    }
    area.present().map_err(e)
}

fn bars<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, s: &Standings) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("{e}");
    let envs = s.environments.len();
    let models = s.models.len();
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!("mean score, {:.0}% interval", 100.0 * s.level),
            (FONT, 22),
        )
        .margin(14)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(-0.5f64..envs as f64 - 0.5, 0f64..1.05)
        .map_err(e)?;
    let names = s.environments.clone();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(envs.max(2))
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < names.len() {
                names[i as usize].clone()
            } else {
                String::new()
            }
        })
        .label_style((FONT, 14))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(e)?;
    let width = 0.8 / models as f64;
    for (j, m) in s.models.iter().enumerate() {
        let color = COLORS[j % COLORS.len()];
        let x0 = |i: usize| i as f64 - 0.4 + j as f64 * width;
        chart
            .draw_series(m.cells.iter().enumerate().map(|(i, c)| {
                Rectangle::new(
                    [
                        (x0(i) + 0.1 * width, 0.0),
                        (x0(i) + 0.9 * width, c.mean_score),
                    ],
                    color.mix(0.75).filled(),
                )
            }))
            .map_err(e)?
            .label(m.name.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], color.filled()));
        chart
            .draw_series(m.cells.iter().enumerate().map(|(i, c)| {
                let x = x0(i) + 0.5 * width;
                PathElement::new(vec![(x, c.lo), (x, c.hi)], BLACK.stroke_width(2))
            }))
            .map_err(e)?;
    }
    chart
        .configure_series_labels()
        .label_font((FONT, 13))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(e)?;
    Ok(())
}

fn scatter<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, s: &Standings) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("{e}");
    let mut chart = ChartBuilder::on(area)
        .caption("models and the Pareto frontier", (FONT, 22))
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(0f64..1.05, 0f64..1.05)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc(s.environments[0].as_str())
        .y_desc(s.environments[1].as_str())
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 15))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(e)?;
    if let Some(v) = s.verdict("pareto") {
        let mut front: Vec<(f64, f64)> = v
            .frontier
            .iter()
            .map(|&i| {
                (
                    s.models[i].cells[0].mean_score,
                    s.models[i].cells[1].mean_score,
                )
            })
            .collect();
        front.sort_by(|a, b| a.0.total_cmp(&b.0));
        chart
            .draw_series(LineSeries::new(
                front,
                RGBColor(120, 120, 120).stroke_width(2),
            ))
            .map_err(e)?
            .label("frontier (pareto rule)")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], RGBColor(120, 120, 120)));
    }
    for (j, m) in s.models.iter().enumerate() {
        let color = COLORS[j % COLORS.len()];
        let (a, b) = (&m.cells[0], &m.cells[1]);
        chart
            .draw_series([
                PathElement::new(
                    vec![(a.lo, b.mean_score), (a.hi, b.mean_score)],
                    color.stroke_width(1),
                ),
                PathElement::new(
                    vec![(a.mean_score, b.lo), (a.mean_score, b.hi)],
                    color.stroke_width(1),
                ),
            ])
            .map_err(e)?;
        chart
            .draw_series([Circle::new((a.mean_score, b.mean_score), 5, color.filled())])
            .map_err(e)?
            .label(m.name.as_str())
            .legend(move |(x, y)| Circle::new((x + 7, y), 5, color.filled()));
    }
    chart
        .configure_series_labels()
        .label_font((FONT, 13))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .position(SeriesLabelPosition::LowerLeft)
        .draw()
        .map_err(e)?;
    Ok(())
}
