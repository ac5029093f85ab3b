//! Raster output: an RGB canvas with an 8×8 bitmap font (font8x8, public domain, ASCII),
//! PNG encoding, and the PNG version of a heatmap figure (the same layout as the SVG:
//! title, panels with their colour bars and tick values, token labels where cells are large
//! enough to carry them).

use crate::tools::insight::heatmap::{Figure, colour, colour_at, fmt_value, scale_max, ticks, token_label};
use crate::tools::insight::maps::Map;

/// `w × h` RGB pixels, row-major.
pub struct Canvas {
    pub w: usize,
    pub h: usize,
    pub px: Vec<[u8; 3]>,
}

const INK: [u8; 3] = [0x22, 0x22, 0x22];
const FRAME: [u8; 3] = [0x44, 0x44, 0x44];

impl Canvas {
    pub fn new(w: usize, h: usize) -> Canvas {
        Canvas { w, h, px: vec![[255; 3]; w * h] }
    }

    pub fn set(&mut self, x: usize, y: usize, c: [u8; 3]) {
        if x < self.w && y < self.h {
            self.px[y * self.w + x] = c;
        }
    }

    pub fn fill(&mut self, x: usize, y: usize, w: usize, h: usize, c: [u8; 3]) {
        for yy in y..(y + h).min(self.h) {
            for xx in x..(x + w).min(self.w) {
                self.px[yy * self.w + xx] = c;
            }
        }
    }

    pub fn frame(&mut self, x: usize, y: usize, w: usize, h: usize, c: [u8; 3]) {
        self.fill(x.saturating_sub(1), y.saturating_sub(1), w + 2, 1, c);
        self.fill(x.saturating_sub(1), y + h, w + 2, 1, c);
        self.fill(x.saturating_sub(1), y, 1, h, c);
        self.fill(x + w, y, 1, h, c);
    }

    /// Draws `text` with its top-left corner at (x, y), 8 px per character; characters the
    /// font lacks (non-ASCII) are drawn as '?'. Returns the width drawn.
    pub fn text(&mut self, x: usize, y: usize, text: &str) -> usize {
        let mut cx = x;
        for ch in ascii(text).chars() {
            let glyph = font8x8::legacy::BASIC_LEGACY[ch as usize];
            for (gy, bits) in glyph.iter().enumerate() {
                for gx in 0..8 {
                    if bits >> gx & 1 == 1 {
                        self.set(cx + gx, y + gy, INK);
                    }
                }
            }
            cx += 8;
        }
        cx - x
    }

    /// Draws `text` rotated 90° counter-clockwise, reading upwards, its last character's top
    /// edge at (x, y) — for column labels under a heatmap, ending at the axis.
    pub fn text_up(&mut self, x: usize, y: usize, text: &str) {
        let s = ascii(text);
        let n = s.chars().count();
        for (i, ch) in s.chars().enumerate() {
            let glyph = font8x8::legacy::BASIC_LEGACY[ch as usize];
            // Character i occupies rows y + 8·(n−1−i) .. +8 (the first is lowest).
            let base_y = y + 8 * (n - i);
            for (gy, bits) in glyph.iter().enumerate() {
                for gx in 0..8 {
                    if bits >> gx & 1 == 1 {
                        // Rotating (gx, gy) counter-clockwise: x' = gy, y' = −gx.
                        self.set(x + gy, (base_y - 1).saturating_sub(gx), INK);
                    }
                }
            }
        }
    }

    /// The canvas as a PNG file.
    pub fn to_png(&self) -> Vec<u8> {
        let mut out = Vec::new();
        {
            let mut enc = png::Encoder::new(&mut out, self.w as u32, self.h as u32);
            enc.set_color(png::ColorType::Rgb);
            enc.set_depth(png::BitDepth::Eight);
            let mut wr = enc.write_header().expect("PNG header into memory");
            wr.write_image_data(self.px.as_flattened()).expect("PNG data into memory");
        }
        out
    }
}

/// `text` with the characters the 8×8 font lacks replaced: the few this module's titles use
/// spelled out, anything else as '?'.
fn ascii(text: &str) -> String {
    let mut s = String::with_capacity(text.len());
    for ch in text.chars() {
        match ch {
            '−' | '–' => s.push('-'),
            'λ' => s.push_str("lambda"),
            '·' => s.push('*'),
            '␣' => s.push('_'),
            '…' => s.push('~'),
            // Subscripts (DIFF V2's A₂ᵢ₊₁, λₜ) as plain characters.
            '₀'..='₉' => s.push(char::from(b'0' + (ch as u32 - '₀' as u32) as u8)),
            '₊' => s.push('+'),
            'ᵢ' => s.push('i'),
            'ₜ' => s.push('t'),
            c if (c as u32) < 128 && !c.is_control() => s.push(c),
            _ => s.push('?'),
        }
    }
    s
}

/// One pixel per cell of `map`, coloured on its scale ending at `vmax`, as a PNG.
pub fn cells_png(map: &Map, vmax: f32) -> Vec<u8> {
    let mut c = Canvas::new(map.cols.max(1), map.rows.max(1));
    for (i, &v) in map.data.iter().enumerate() {
        c.px[i] = colour(map.scale, vmax, v);
    }
    c.to_png()
}

/// The figure as a PNG: cells of an integer number of pixels (the longer side about 400),
/// labels when cells are at least 8 px.
pub fn figure_png(fig: &Figure<'_>) -> Vec<u8> {
    let Some(first) = fig.panels.first() else { return Canvas::new(1, 1).to_png() };
    let (rows, cols) = (first.map.rows.max(1), first.map.cols.max(1));
    let cell = (400 / rows.max(cols)).clamp(1, 16);
    let (w, h) = (cell * cols, cell * rows);
    let labels = cell >= 8;
    let label_px = 8 * 10 + 4;
    let margin_l = if labels { label_px } else { 12 };
    let margin_b = if labels { label_px } else { 12 };
    let (margin_t, bar_gap, bar_w, bar_text) = (40, 8, 12, 8 * 7);
    let panel_w = margin_l + w + bar_gap + bar_w + bar_text;
    let mut c = Canvas::new(panel_w * fig.panels.len() + 8, margin_t + h + margin_b);
    c.text(8, 6, &fig.title);
    for (pi, p) in fig.panels.iter().enumerate() {
        let m = p.map;
        let vmax = scale_max(m);
        let (x0, y0) = (pi * panel_w + margin_l, margin_t);
        c.text(x0, y0 - 14, &p.title);
        for r in 0..m.rows {
            for col in 0..m.cols {
                c.fill(x0 + col * cell, y0 + r * cell, cell, cell, colour(m.scale, vmax, m.data[r * m.cols + col]));
            }
        }
        c.frame(x0, y0, w, h, FRAME);
        if labels {
            for (r, l) in fig.row_labels.iter().take(m.rows).enumerate() {
                let t = token_label(l);
                let tw = 8 * ascii(&t).chars().count();
                c.text((x0 - 3).saturating_sub(tw), y0 + r * cell + (cell - 8) / 2, &t);
            }
            for (col, l) in fig.col_labels.iter().take(m.cols).enumerate() {
                c.text_up(x0 + col * cell + (cell - 8) / 2, y0 + h + 3, &token_label(l));
            }
        }
        let bx = x0 + w + bar_gap;
        for y in 0..h {
            let t = 1.0 - y as f32 / (h.max(2) - 1) as f32;
            c.fill(bx, y0 + y, bar_w, 1, colour_at(m.scale, t));
        }
        c.frame(bx, y0, bar_w, h, FRAME);
        for (t, v) in ticks(m.scale, vmax) {
            let y = y0 + ((1.0 - t) * (h - 1) as f32).round() as usize;
            c.fill(bx + bar_w, y, 3, 1, FRAME);
            c.text(bx + bar_w + 6, y.saturating_sub(4), &fmt_value(v));
        }
    }
    c.to_png()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::insight::heatmap::Panel;
    use crate::tools::insight::maps::MapScale;

    #[test]
    fn png_decodes_to_the_drawn_pixels() {
        let m = Map {
            name: "m".into(),
            scale: MapScale::Weights,
            rows: 2,
            cols: 3,
            data: vec![0.0, 1.0, 0.0, 0.5, 0.0, 0.25],
        };
        let bytes = cells_png(&m, 1.0);
        let mut dec = png::Decoder::new(std::io::Cursor::new(bytes)).read_info().unwrap();
        let mut buf = vec![0; dec.output_buffer_size()];
        let info = dec.next_frame(&mut buf).unwrap();
        assert_eq!((info.width, info.height), (3, 2));
        assert_eq!(buf[3..6], colour(MapScale::Weights, 1.0, 1.0));
        assert_eq!(buf[..3], colour(MapScale::Weights, 1.0, 0.0));
    }

    #[test]
    fn text_draws_ink_inside_its_box_only() {
        let mut c = Canvas::new(40, 12);
        let w = c.text(2, 2, "Hi");
        assert_eq!(w, 16);
        let inked: Vec<(usize, usize)> =
            (0..c.h).flat_map(|y| (0..c.w).map(move |x| (x, y))).filter(|&(x, y)| c.px[y * 40 + x] == INK).collect();
        assert!(!inked.is_empty());
        assert!(inked.iter().all(|&(x, y)| (2..18).contains(&x) && (2..10).contains(&y)));
        assert_eq!(ascii("A1 − λ·A2 é"), "A1 - lambda*A2 ?");
        assert_eq!(ascii("A₂ᵢ − λₜ·A₂ᵢ₊₁"), "A2i - lambdat*A2i+1");
    }

    #[test]
    fn figure_png_has_the_panels_side_by_side() {
        let a = Map { name: "a".into(), scale: MapScale::Weights, rows: 4, cols: 4, data: vec![0.25; 16] };
        let fig = Figure {
            title: "t".into(),
            panels: vec![Panel { title: "A1".into(), map: &a }, Panel { title: "A2".into(), map: &a }],
            row_labels: vec!["a".into(); 4],
            col_labels: vec!["b".into(); 4],
        };
        let png = figure_png(&fig);
        let dec = png::Decoder::new(std::io::Cursor::new(png)).read_info().unwrap();
        // 4 cells of 16 px, labels on: two panels of 84 + 64 + 8 + 12 + 56.
        assert_eq!(dec.info().width as usize, 2 * (84 + 64 + 8 + 12 + 56) + 8);
    }
}
