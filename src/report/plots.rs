//! Inline SVG plots for the release report (`plotters`' SVG backend: no
//! network fetches, no fonts to load; the browser renders the text).

use plotters::prelude::*;

/// A failed plot (plotters' drawing errors carry no data).
#[derive(Debug, thiserror::Error)]
#[error("drawing the report's plot failed: {0}")]
pub struct PlotError(String);

fn err<E: std::fmt::Debug>(e: E) -> PlotError {
    PlotError(format!("{e:?}"))
}

/// The label of category `i` at its centre `i + 0.5` on a category axis
/// (the ticks are at every half unit; the others stay blank).
fn centred_label(labels: &[String], x: f64) -> String {
    if (x - x.floor() - 0.5).abs() < 1e-9 {
        labels.get(x.floor() as usize).cloned().unwrap_or_default()
    } else {
        String::new()
    }
}

/// The dataset's cumulative spending over its ledger charges (a step line)
/// against its total budget (a horizontal line). `points`: (charge number,
/// cumulative spent), charge numbers from 1.
pub fn budget_timeline(points: &[(f64, f64)], total: f64, unit: &str) -> Result<String, PlotError> {
    let mut s = String::new();
    {
        let root = SVGBackend::with_string(&mut s, (760, 280)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let n = points.len().max(1) as f64;
        let top = points.iter().map(|p| p.1).fold(total, f64::max) * 1.08;
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(56)
            .build_cartesian_2d(0f64..n + 0.5, 0f64..top.max(f64::MIN_POSITIVE))
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_labels((points.len() + 1).min(20))
            .x_label_formatter(&|x| if (x - x.round()).abs() < 1e-9 { format!("{x:.0}") } else { String::new() })
            .x_desc("ledger charge (oldest first)")
            .y_desc(format!("spent ({unit})"))
            .draw()
            .map_err(err)?;
        let mut steps = vec![(0.0, 0.0)];
        for &(x, y) in points {
            let prev = steps.last().map_or(0.0, |p: &(f64, f64)| p.1);
            steps.push((x, prev));
            steps.push((x, y));
        }
        steps.push((n + 0.5, steps.last().map_or(0.0, |p| p.1)));
        chart.draw_series(LineSeries::new(steps, BLUE.stroke_width(2))).map_err(err)?;
        chart.draw_series(LineSeries::new(vec![(0.0, total), (n + 0.5, total)], RED.stroke_width(1))).map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(s)
}

/// A one-way marginal: the synthetic data's shares (bars) against the noisy
/// measurement's shares with their intervals (points with error bars).
/// `noisy`: (share, half-width as a share) per cell.
pub fn marginal(labels: &[String], synthetic: &[f64], noisy: &[(f64, f64)]) -> Result<String, PlotError> {
    let k = labels.len().max(1);
    let mut s = String::new();
    {
        let width = (120 + 28 * k).clamp(360, 1200) as u32;
        let root = SVGBackend::with_string(&mut s, (width, 260)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let top =
            synthetic.iter().copied().chain(noisy.iter().map(|(v, h)| v + h)).fold(0.0f64, f64::max).max(1e-9) * 1.1;
        let bottom = noisy.iter().map(|(v, h)| v - h).fold(0.0f64, f64::min);
        let mut chart = ChartBuilder::on(&root)
            .margin(10)
            .x_label_area_size(if k > 12 { 70 } else { 30 })
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..k as f64, bottom..top)
            .map_err(err)?;
        let label_of = |x: &f64| centred_label(labels, *x);
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(2 * k + 1)
            .x_label_formatter(&label_of)
            .y_desc("share")
            .draw()
            .map_err(err)?;
        chart
            .draw_series(synthetic.iter().enumerate().map(|(i, &v)| {
                Rectangle::new([(i as f64 + 0.15, 0.0), (i as f64 + 0.85, v)], RGBColor(158, 202, 225).filled())
            }))
            .map_err(err)?;
        chart
            .draw_series(noisy.iter().enumerate().map(|(i, &(v, h))| {
                let x = i as f64 + 0.5;
                PathElement::new(vec![(x, v - h), (x, v + h)], BLACK.stroke_width(1))
            }))
            .map_err(err)?;
        chart
            .draw_series(
                noisy.iter().enumerate().map(|(i, &(v, _))| Circle::new((i as f64 + 0.5, v), 3, BLACK.filled())),
            )
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(s)
}

/// A heat map of a symmetric matrix of TVDs (white 0 → dark red at `max`);
/// `None` cells (the diagonal) are grey.
pub fn heatmap(labels: &[String], m: &[Vec<Option<f64>>], max: f64) -> Result<String, PlotError> {
    let d = labels.len().max(1);
    let side = (160 + 26 * d).clamp(320, 900) as u32;
    let mut s = String::new();
    {
        let root = SVGBackend::with_string(&mut s, (side, side)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(8)
            .x_label_area_size(110)
            .y_label_area_size(110)
            .build_cartesian_2d(0f64..d as f64, 0f64..d as f64)
            .map_err(err)?;
        let label_of = |x: &f64| centred_label(labels, *x);
        chart
            .configure_mesh()
            .disable_mesh()
            .x_labels(2 * d + 1)
            .y_labels(2 * d + 1)
            .x_label_formatter(&label_of)
            .y_label_formatter(&label_of)
            .draw()
            .map_err(err)?;
        let max = if max > 0.0 { max } else { 1.0 };
        chart
            .draw_series(m.iter().enumerate().flat_map(|(i, row)| {
                row.iter().enumerate().map(move |(j, v)| {
                    let color = match v {
                        None => RGBColor(200, 200, 200),
                        Some(v) => {
                            let t = (v / max).clamp(0.0, 1.0);
                            RGBColor(255 - (t * 75.0) as u8, 255 - (t * 255.0) as u8, 255 - (t * 255.0) as u8)
                        }
                    };
                    Rectangle::new([(j as f64, i as f64), (j as f64 + 1.0, i as f64 + 1.0)], color.filled())
                })
            }))
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(s)
}
