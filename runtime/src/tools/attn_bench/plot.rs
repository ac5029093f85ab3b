//! Minimal SVG line charts (no dependencies): one panel per metric, bits on x, one line per
//! series, with axes, ticks and a legend.

use std::fmt::Write;

use crate::tools::insight::html::esc;

/// One line of a chart.
#[derive(Clone, Debug)]
pub struct Series {
    pub label: String,
    /// (x, y) points; drawn in order.
    pub points: Vec<(f64, f64)>,
}

/// One panel.
#[derive(Clone, Debug)]
pub struct Panel {
    pub title: String,
    pub y_label: String,
    pub series: Vec<Series>,
    /// Logarithmic y axis (for KL divergence, which spans decades).
    pub log_y: bool,
}

const PALETTE: [&str; 10] =
    ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
const DASHES: [&str; 4] = ["", "6,3", "2,3", "8,3,2,3"];

/// "Nice" tick values covering [lo, hi].
// `!(hi > lo)` also catches NaN bounds, which `hi <= lo` would not.
#[allow(clippy::neg_cmp_op_on_partial_ord)]
fn ticks(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    if !(hi > lo) {
        return vec![lo];
    }
    let raw = (hi - lo) / n.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0].iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(10.0 * mag);
    let start = (lo / step).ceil() * step;
    let mut v = Vec::new();
    let mut t = start;
    while t <= hi + step * 1e-9 {
        v.push(t);
        t += step;
    }
    v
}

fn fmt_num(v: f64) -> String {
    if v != 0.0 && (v.abs() < 1e-3 || v.abs() >= 1e5) {
        format!("{v:.0e}")
    } else {
        format!("{}", (v * 1e4).round() / 1e4)
    }
}

/// Renders `panels` side by side. `x_ticks` are the x values to label (e.g. 16, 8, 6, 4);
/// the x axis runs from high to low bits when `reverse_x`.
pub fn render(title: &str, x_label: &str, x_ticks: &[f64], reverse_x: bool, panels: &[Panel]) -> String {
    let (pw, ph) = (460.0, 320.0);
    let (ml, mr, mt, mb) = (70.0, 20.0, 40.0, 50.0);
    let legend_rows = panels.iter().map(|p| p.series.len()).max().unwrap_or(0);
    let legend_h = 18.0 * legend_rows as f64 + 10.0;
    let width = pw * panels.len() as f64;
    let height = ph + legend_h + 30.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ =
        writeln!(s, r#"<text x="{}" y="20" text-anchor="middle" font-size="15">{}</text>"#, width / 2.0, esc(title));
    let (xmin, xmax) = x_ticks.iter().fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
    for (pi, p) in panels.iter().enumerate() {
        let ox = pw * pi as f64;
        let (x0, x1, y0, y1) = (ox + ml, ox + pw - mr, 30.0 + mt, 30.0 + ph - mb);
        let tr_y = |v: f64| if p.log_y { v.max(1e-12).log10() } else { v };
        let ys: Vec<f64> =
            p.series.iter().flat_map(|s| s.points.iter().map(|pt| tr_y(pt.1))).filter(|v| v.is_finite()).collect();
        let (mut ylo, mut yhi) = ys.iter().fold((f64::MAX, f64::MIN), |(a, b), &y| (a.min(y), b.max(y)));
        if ys.is_empty() {
            (ylo, yhi) = (0.0, 1.0);
        }
        if yhi - ylo < 1e-12 {
            ylo -= 0.5;
            yhi += 0.5;
        }
        let pad = (yhi - ylo) * 0.08;
        let (ylo, yhi) = (ylo - pad, yhi + pad);
        let px = |x: f64| {
            let f = if xmax > xmin { (x - xmin) / (xmax - xmin) } else { 0.5 };
            if reverse_x { x1 - f * (x1 - x0) } else { x0 + f * (x1 - x0) }
        };
        let py = |y: f64| y1 - (tr_y(y) - ylo) / (yhi - ylo) * (y1 - y0);
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle" font-size="13">{}</text>"#,
            (x0 + x1) / 2.0,
            y0 - 12.0,
            esc(&p.title)
        );
        let _ = writeln!(
            s,
            r##"<rect x="{x0}" y="{y0}" width="{}" height="{}" fill="none" stroke="#333"/>"##,
            x1 - x0,
            y1 - y0
        );
        for &t in x_ticks {
            let x = px(t);
            let _ = writeln!(
                s,
                r##"<line x1="{x}" y1="{y1}" x2="{x}" y2="{}" stroke="#333"/><text x="{x}" y="{}" text-anchor="middle">{}</text>"##,
                y1 + 4.0,
                y1 + 17.0,
                fmt_num(t)
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            (x0 + x1) / 2.0,
            y1 + 34.0,
            esc(x_label)
        );
        let yt = if p.log_y {
            (ylo.ceil() as i64..=yhi.floor() as i64).map(|e| e as f64).collect::<Vec<_>>()
        } else {
            ticks(ylo, yhi, 5)
        };
        for t in yt {
            let val = if p.log_y { 10f64.powf(t) } else { t };
            let y = py(val);
            let _ = writeln!(
                s,
                r##"<line x1="{x0}" y1="{y}" x2="{x1}" y2="{y}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{}</text>"##,
                x0 - 5.0,
                y + 4.0,
                fmt_num(val)
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle" transform="rotate(-90 {} {})">{}</text>"#,
            ox + 16.0,
            (y0 + y1) / 2.0,
            ox + 16.0,
            (y0 + y1) / 2.0,
            esc(&p.y_label)
        );
        for (si, series) in p.series.iter().enumerate() {
            let color = PALETTE[si % PALETTE.len()];
            let dash = DASHES[(si / PALETTE.len()) % DASHES.len()];
            let pts: Vec<String> = series
                .points
                .iter()
                .filter(|pt| pt.1.is_finite())
                .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
                .collect();
            let _ = writeln!(
                s,
                r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2" stroke-dasharray="{dash}"/>"#,
                pts.join(" ")
            );
            for pt in &pts {
                let (cx, cy) = pt.split_once(',').unwrap_or(("0", "0"));
                let _ = writeln!(s, r#"<circle cx="{cx}" cy="{cy}" r="3" fill="{color}"/>"#);
            }
            let ly = 30.0 + ph + 14.0 + 18.0 * si as f64;
            let _ = writeln!(
                s,
                r#"<line x1="{}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="2" stroke-dasharray="{dash}"/><text x="{}" y="{}">{}</text>"#,
                x0,
                x0 + 24.0,
                x0 + 30.0,
                ly + 4.0,
                esc(&series.label)
            );
        }
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_well_formed_svg_with_every_series() {
        let panel = |log_y| Panel {
            title: "t <&>".into(),
            y_label: "y".into(),
            log_y,
            series: vec![
                Series { label: "DIFF logits".into(), points: vec![(16.0, 1e-6), (8.0, 1e-4), (4.0, 0.1)] },
                Series { label: "Llama logits".into(), points: vec![(16.0, 1e-6), (8.0, 1e-3), (4.0, f64::NAN)] },
            ],
        };
        let svg = render("attention bits", "bits", &[16.0, 8.0, 6.0, 4.0], true, &[panel(false), panel(true)]);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 4);
        assert!(svg.contains("DIFF logits") && svg.contains("t &lt;&amp;&gt;"));
        assert!(!svg.contains("NaN"));
    }

    #[test]
    fn ticks_are_round() {
        let t = ticks(0.0, 1.0, 5);
        assert_eq!(t.len(), 6);
        for (i, v) in t.iter().enumerate() {
            assert!((v - 0.2 * i as f64).abs() < 1e-9);
        }
        // Any range: inside it, evenly spaced by 1, 2, 2.5 or 5 × 10^k, at most n + 1 of them.
        for (lo, hi, n) in [(3.0, 47.0, 4), (0.013, 0.9, 5), (60.0, 100.0, 5), (1e-6, 3e-3, 4)] {
            let t = ticks(lo, hi, n);
            assert!(t.len() >= 2 && t.len() <= n + 1, "{lo}..{hi}: {t:?}");
            assert!(t.iter().all(|&v| v >= lo - 1e-12 && v <= hi + 1e-12), "{lo}..{hi}: {t:?}");
            let step = t[1] - t[0];
            assert!(t.windows(2).all(|w| ((w[1] - w[0]) - step).abs() < 1e-9 * step.max(1e-300)));
            let mant = step / 10f64.powf(step.log10().floor());
            assert!([1.0, 2.0, 2.5, 5.0].iter().any(|m| (m - mant).abs() < 1e-6), "{lo}..{hi}: step {step}");
        }
    }
}
