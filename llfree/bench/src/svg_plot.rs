//! Minimal SVG line charts: panels side by side, each with axes, ticks, a title and a legend.

use std::fmt::Write;

/// One line of a panel.
#[derive(Debug)]
pub struct Series<'a> {
    /// The legend entry.
    pub name: &'a str,
    /// The points, in drawing order.
    pub points: Vec<(f64, f64)>,
}

/// One chart.
#[derive(Debug)]
pub struct Panel<'a> {
    /// Shown above the chart.
    pub title: &'a str,
    /// The label of the x axis.
    pub x_label: &'a str,
    /// The label of the y axis.
    pub y_label: &'a str,
    /// The lines.
    pub series: Vec<Series<'a>>,
}

const PANEL_W: f64 = 480.0;
const PANEL_H: f64 = 340.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;
const COLORS: [&str; 6] = [
    "#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
];

/// A "nice" tick step (1, 2 or 5 times a power of ten) giving about five ticks over `span`.
fn tick_step(span: f64) -> f64 {
    if span <= 0.0 || !span.is_finite() {
        return 1.0;
    }
    let raw = span / 5.0;
    let power = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * power)
        .find(|&step| step >= raw)
        .unwrap_or(10.0 * power)
}

/// An axis from 0 to a multiple of a nice tick step that covers every value.
struct Axis {
    step: f64,
    top: f64,
}

impl Axis {
    fn new(values: impl Iterator<Item = f64>) -> Self {
        let max = values.fold(0f64, f64::max);
        let step = tick_step(max);
        Self {
            step,
            top: (max / step).ceil().max(1.0) * step,
        }
    }

    /// The tick values, from 0 to the top.
    fn ticks(&self) -> impl Iterator<Item = f64> + '_ {
        (0..=(self.top / self.step).round() as usize).map(|i| i as f64 * self.step)
    }
}

/// Escapes text for SVG.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Renders the panels side by side into one SVG document.
pub fn render(panels: &[Panel<'_>]) -> String {
    let width = PANEL_W * panels.len().max(1) as f64;
    let mut svg = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{PANEL_H}" font-family="sans-serif" font-size="12">"#
    );
    svg.push_str(r#"<rect width="100%" height="100%" fill="white"/>"#);
    for (index, panel) in panels.iter().enumerate() {
        // Writing to a String cannot fail.
        let _ = draw_panel(&mut svg, panel, index as f64 * PANEL_W);
    }
    svg.push_str("</svg>\n");
    svg
}

fn draw_panel(svg: &mut String, panel: &Panel<'_>, x0: f64) -> std::fmt::Result {
    let points = || panel.series.iter().flat_map(|s| s.points.iter());
    let x_axis = Axis::new(points().map(|&(x, _)| x));
    let y_axis = Axis::new(points().map(|&(_, y)| y));
    let (plot_w, plot_h) = (PANEL_W - LEFT - RIGHT, PANEL_H - TOP - BOTTOM);
    let (left, bottom) = (x0 + LEFT, TOP + plot_h);
    let sx = |x: f64| left + x / x_axis.top * plot_w;
    let sy = |y: f64| bottom - y / y_axis.top * plot_h;
    write!(
        svg,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="14">{}</text>"#,
        left + plot_w / 2.0,
        escape(panel.title)
    )?;
    write!(
        svg,
        r#"<rect x="{left}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="black"/>"#
    )?;
    for tick in x_axis.ticks() {
        let x = sx(tick);
        write!(
            svg,
            r#"<line x1="{x}" y1="{bottom}" x2="{x}" y2="{}" stroke="black"/><text x="{x}" y="{}" text-anchor="middle">{tick}</text>"#,
            bottom + 5.0,
            bottom + 18.0
        )?;
    }
    for tick in y_axis.ticks() {
        let y = sy(tick);
        write!(
            svg,
            r##"<line x1="{left}" y1="{y}" x2="{}" y2="{y}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{tick}</text>"##,
            left + plot_w,
            left - 6.0,
            y + 4.0
        )?;
    }
    write!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        left + plot_w / 2.0,
        PANEL_H - 12.0,
        escape(panel.x_label)
    )?;
    let (label_x, label_y) = (x0 + 16.0, TOP + plot_h / 2.0);
    write!(
        svg,
        r#"<text x="{label_x}" y="{label_y}" text-anchor="middle" transform="rotate(-90 {label_x} {label_y})">{}</text>"#,
        escape(panel.y_label)
    )?;
    for (index, series) in panel.series.iter().enumerate() {
        let color = COLORS[index % COLORS.len()];
        let path: Vec<String> = series
            .points
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
            .collect();
        write!(
            svg,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
            path.join(" ")
        )?;
        let legend_y = TOP + 16.0 + 16.0 * index as f64;
        let legend_x = left + plot_w - 110.0;
        write!(
            svg,
            r#"<line x1="{legend_x}" y1="{}" x2="{}" y2="{}" stroke="{color}" stroke-width="2"/><text x="{}" y="{legend_y}">{}</text>"#,
            legend_y - 4.0,
            legend_x + 20.0,
            legend_y - 4.0,
            legend_x + 26.0,
            escape(series.name)
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_tick_steps() {
        assert_eq!(tick_step(100.0), 20.0);
        assert_eq!(tick_step(7.0), 2.0);
        assert_eq!(tick_step(30_000.0), 10_000.0);
        assert_eq!(tick_step(0.0), 1.0);
    }

    #[test]
    fn renders_panels_with_lines_and_legends() {
        let panel = |title| Panel {
            title,
            x_label: "round",
            y_label: "frames",
            series: vec![
                Series {
                    name: "llfree",
                    points: vec![(0.0, 1.0), (100.0, 50.0)],
                },
                Series {
                    name: "a<b",
                    points: vec![(0.0, 1.0), (100.0, 2.0)],
                },
            ],
        };
        let svg = render(&[panel("left"), panel("right")]);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 4);
        assert!(svg.contains("a&lt;b") && svg.contains(">left<") && svg.contains(">right<"));
        assert!(svg.contains(r#"width="960""#));
    }
}
