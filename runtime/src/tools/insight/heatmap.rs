//! Heatmap figures of attention maps: one panel per map side by side (DIFF: A1, A2 and
//! A1 − λ·A2), each with its colour scale, token labels on the axes where they are readable.
//!
//! Colours: softmax weights on a sequential scale from 0 to the map's largest weight,
//! DIFF's differential map on a diverging one symmetric about 0 (blue negative, red
//! positive). Both scales are square-root ones (colour position ∝ √(|w| / max)), because one
//! attention sink (often the first token) would otherwise leave every other weight dark; the
//! colour bar's ticks give the true values. The SVG carries the cells as an embedded PNG
//! (one pixel per cell, drawn pixelated) and everything else as vector text and shapes.

use std::fmt::Write;

use crate::tools::insight::html::esc;
use crate::tools::insight::maps::{Map, MapScale};
use crate::tools::insight::raster;

/// One map with its title.
pub struct Panel<'a> {
    pub title: String,
    pub map: &'a Map,
}

/// A figure: panels side by side over the same tokens.
pub struct Figure<'a> {
    pub title: String,
    pub panels: Vec<Panel<'a>>,
    /// The query tokens (one per map row) and the key tokens (one per column), as text.
    pub row_labels: Vec<String>,
    pub col_labels: Vec<String>,
}

const SEQUENTIAL: [[u8; 3]; 10] = [
    [0x44, 0x01, 0x54],
    [0x48, 0x28, 0x78],
    [0x3e, 0x49, 0x89],
    [0x31, 0x68, 0x8e],
    [0x26, 0x82, 0x8e],
    [0x1f, 0x9e, 0x89],
    [0x35, 0xb7, 0x79],
    [0x6e, 0xce, 0x58],
    [0xb5, 0xde, 0x2b],
    [0xfd, 0xe7, 0x25],
];
const DIVERGING: [[u8; 3]; 11] = [
    [0x05, 0x30, 0x61],
    [0x21, 0x66, 0xac],
    [0x43, 0x93, 0xc3],
    [0x92, 0xc5, 0xde],
    [0xd1, 0xe5, 0xf0],
    [0xf7, 0xf7, 0xf7],
    [0xfd, 0xdb, 0xc7],
    [0xf4, 0xa5, 0x82],
    [0xd6, 0x60, 0x4d],
    [0xb2, 0x18, 0x2b],
    [0x67, 0x00, 0x1f],
];

/// The value that a colour-bar end stands for: the largest weight, or the largest |weight|
/// (1 for an all-zero map, so the scale stays defined).
pub fn scale_max(map: &Map) -> f32 {
    let m = map.data.iter().fold(0f32, |m, &v| m.max(v.abs()));
    if m > 0.0 && m.is_finite() { m } else { 1.0 }
}

/// The position on the colour bar (0 to 1) of value `v`.
fn position(scale: MapScale, vmax: f32, v: f32) -> f32 {
    let t = (v.abs() / vmax).min(1.0).sqrt();
    match scale {
        MapScale::Weights => t,
        MapScale::Signed => 0.5 + 0.5 * t.copysign(v),
    }
}

fn ramp(stops: &[[u8; 3]], t: f32) -> [u8; 3] {
    let t = if t.is_finite() { t.clamp(0.0, 1.0) } else { 0.0 };
    let x = t * (stops.len() - 1) as f32;
    let i = (x.floor() as usize).min(stops.len() - 2);
    let f = x - i as f32;
    let mix = |a: u8, b: u8| (a as f32 + (b as f32 - a as f32) * f).round() as u8;
    [mix(stops[i][0], stops[i + 1][0]), mix(stops[i][1], stops[i + 1][1]), mix(stops[i][2], stops[i + 1][2])]
}

/// The colour of colour-bar position `t` (0 to 1).
pub fn colour_at(scale: MapScale, t: f32) -> [u8; 3] {
    match scale {
        MapScale::Weights => ramp(&SEQUENTIAL, t),
        MapScale::Signed => ramp(&DIVERGING, t),
    }
}

/// The colour of value `v` in a map whose scale ends at `vmax`.
pub fn colour(scale: MapScale, vmax: f32, v: f32) -> [u8; 3] {
    colour_at(scale, position(scale, vmax, v))
}

/// Colour-bar ticks: (position 0–1, value).
pub fn ticks(scale: MapScale, vmax: f32) -> Vec<(f32, f32)> {
    let at = [0.0f32, 0.25, 0.5, 0.75, 1.0];
    match scale {
        MapScale::Weights => at.iter().map(|&t| (t, vmax * t * t)).collect(),
        MapScale::Signed => {
            at.iter().map(|&t| (t, vmax * ((2.0 * t - 1.0).abs().powi(2)).copysign(2.0 * t - 1.0))).collect()
        }
    }
}

/// A number for a tick label: 3 significant digits.
pub fn fmt_value(v: f32) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let digits = (2 - v.abs().log10().floor() as i32).max(0) as usize;
    format!("{v:.digits$}")
}

/// A token as an axis label: newlines and tabs shown escaped, surrounding spaces dropped
/// (a lone space shown as ␣), at most 10 characters.
pub fn token_label(t: &str) -> String {
    let s = t.replace('\n', "\\n").replace('\t', "\\t");
    let trimmed = s.trim();
    let s = if trimmed.is_empty() && !s.is_empty() { "␣".to_string() } else { trimmed.to_string() };
    if s.chars().count() > 10 { s.chars().take(9).chain(['…']).collect() } else { s }
}

fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (c[0] as u32) << 16 | (*c.get(1).unwrap_or(&0) as u32) << 8 | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            out.push(if i <= c.len() { A[(n >> (18 - 6 * i) & 63) as usize] as char } else { '=' });
        }
    }
    out
}

/// Labels are drawn when each cell is at least this many pixels tall.
const MIN_LABEL_PX: f32 = 6.0;
/// Side of a panel's heatmap (the longer side) in SVG pixels.
const PANEL_PX: f32 = 420.0;

/// The figure as a standalone SVG document.
pub fn to_svg(fig: &Figure<'_>) -> String {
    let Some(first) = fig.panels.first() else { return String::new() };
    let (rows, cols) = (first.map.rows.max(1), first.map.cols.max(1));
    let cell = PANEL_PX / rows.max(cols) as f32;
    let (w, h) = (cell * cols as f32, cell * rows as f32);
    let labels = cell >= MIN_LABEL_PX;
    let font = (cell * 0.85).min(11.0);
    let margin_l = if labels { 70.0 } else { 20.0 };
    let margin_b = if labels { 70.0 } else { 20.0 };
    let (margin_t, bar_w, bar_gap, bar_text) = (52.0, 12.0, 8.0, 56.0);
    let panel_w = margin_l + w + bar_gap + bar_w + bar_text;
    let total_w = panel_w * fig.panels.len() as f32 + 10.0;
    let total_h = margin_t + h + margin_b;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{total_w:.0}" height="{total_h:.0}" viewBox="0 0 {total_w:.0} {total_h:.0}" font-family="sans-serif">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(s, r#"<text x="10" y="20" font-size="15" font-weight="bold">{}</text>"#, esc(&fig.title));
    for (pi, p) in fig.panels.iter().enumerate() {
        let m = p.map;
        let vmax = scale_max(m);
        let x0 = pi as f32 * panel_w + margin_l;
        let y0 = margin_t;
        let _ = writeln!(s, r#"<text x="{x0:.1}" y="{:.1}" font-size="13">{}</text>"#, y0 - 8.0, esc(&p.title));
        let png = raster::cells_png(m, vmax);
        let _ = writeln!(
            s,
            r#"<image x="{x0:.1}" y="{y0:.1}" width="{w:.1}" height="{h:.1}" preserveAspectRatio="none" style="image-rendering:pixelated" href="data:image/png;base64,{}"/>"#,
            base64(&png)
        );
        let _ = writeln!(
            s,
            r##"<rect x="{x0:.1}" y="{y0:.1}" width="{w:.1}" height="{h:.1}" fill="none" stroke="#444"/>"##
        );
        if labels {
            for (r, l) in fig.row_labels.iter().take(m.rows).enumerate() {
                let y = y0 + (r as f32 + 0.5) * cell;
                let _ = writeln!(
                    s,
                    r#"<text x="{:.1}" y="{y:.1}" font-size="{font:.1}" text-anchor="end" dominant-baseline="middle">{}</text>"#,
                    x0 - 3.0,
                    esc(&token_label(l))
                );
            }
            for (c, l) in fig.col_labels.iter().take(m.cols).enumerate() {
                let x = x0 + (c as f32 + 0.5) * cell;
                let y = y0 + h + 3.0;
                let _ = writeln!(
                    s,
                    r#"<text transform="translate({x:.1},{y:.1}) rotate(-90)" font-size="{font:.1}" text-anchor="end" dominant-baseline="middle">{}</text>"#,
                    esc(&token_label(l))
                );
            }
        } else {
            let _ = writeln!(
                s,
                r#"<text x="{x0:.1}" y="{:.1}" font-size="11">query position ↓ {} · key position → {}</text>"#,
                y0 + h + 14.0,
                m.rows,
                m.cols
            );
        }
        // The colour bar: a gradient over its positions, ticks at the values they stand for.
        let bx = x0 + w + bar_gap;
        let gid = format!("bar{pi}");
        let _ = write!(s, r#"<defs><linearGradient id="{gid}" x1="0" y1="1" x2="0" y2="0">"#);
        for i in 0..=20 {
            let t = i as f32 / 20.0;
            let [r, g, b] = colour_at(m.scale, t);
            let _ = write!(s, r#"<stop offset="{t:.2}" stop-color="rgb({r},{g},{b})"/>"#);
        }
        let _ = writeln!(s, "</linearGradient></defs>");
        let _ = writeln!(
            s,
            r##"<rect x="{bx:.1}" y="{y0:.1}" width="{bar_w}" height="{h:.1}" fill="url(#{gid})" stroke="#444"/>"##
        );
        for (t, v) in ticks(m.scale, vmax) {
            let y = y0 + h * (1.0 - t);
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{y:.1}" font-size="10" dominant-baseline="middle">{}</text>"#,
                bx + bar_w + 3.0,
                fmt_value(v)
            );
        }
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(scale: MapScale, data: Vec<f32>, n: usize) -> Map {
        Map { name: "m".into(), scale, rows: n, cols: n, data }
    }

    #[test]
    fn colour_scales_end_at_their_extremes() {
        assert_eq!(colour(MapScale::Weights, 0.5, 0.0), SEQUENTIAL[0]);
        assert_eq!(colour(MapScale::Weights, 0.5, 0.5), SEQUENTIAL[9]);
        assert_eq!(colour(MapScale::Signed, 2.0, 0.0), DIVERGING[5]);
        assert_eq!(colour(MapScale::Signed, 2.0, -2.0), DIVERGING[0]);
        assert_eq!(colour(MapScale::Signed, 2.0, 2.0), DIVERGING[10]);
        // Square-root scale: a quarter of the maximum sits halfway.
        assert!((position(MapScale::Weights, 1.0, 0.25) - 0.5).abs() < 1e-6);
        let t = ticks(MapScale::Signed, 4.0);
        assert_eq!(t[0], (0.0, -4.0));
        assert_eq!(t[1], (0.25, -1.0));
        assert_eq!(t[2].1, 0.0);
    }

    #[test]
    fn svg_has_one_image_and_colour_bar_per_panel_and_labels_when_readable() {
        let a = map(MapScale::Weights, vec![1.0, 0.0, 0.4, 0.6], 2);
        let d = map(MapScale::Signed, vec![0.8, 0.0, -0.1, 0.3], 2);
        let fig = Figure {
            title: "layer 0 <pair 0>".into(),
            panels: vec![Panel { title: "A1".into(), map: &a }, Panel { title: "A1 − λ·A2".into(), map: &d }],
            row_labels: vec!["<s>".into(), " the".into()],
            col_labels: vec!["<s>".into(), " the".into()],
        };
        let svg = to_svg(&fig);
        assert_eq!(svg.matches("<image ").count(), 2);
        assert_eq!(svg.matches("<linearGradient").count(), 2);
        assert!(svg.contains("&lt;pair 0&gt;") && svg.contains(">the<") && svg.contains("&lt;s&gt;"));
        assert!(svg.contains(">-0.800<"), "diverging ticks run from −max: {svg}");
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    }

    #[test]
    fn base64_matches_known_vectors() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    }

    #[test]
    fn token_labels_are_short_and_visible() {
        assert_eq!(token_label(" the"), "the");
        assert_eq!(token_label(" "), "␣");
        assert_eq!(token_label("\n"), "\\n");
        assert_eq!(token_label("internationalization"), "internati…");
    }
}
