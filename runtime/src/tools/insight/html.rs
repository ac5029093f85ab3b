//! One self-contained HTML report (inline SVG and CSS, no network, no external files) for
//! `attn-map`, `needle` and `attn-bench`.
//!
//! The page carries a small script that records script errors and, once loaded, how many
//! figures it holds and how many rendered with a non-empty box, as attributes of `<body>`
//! (`data-figures`, `data-rendered`, `data-errors`): a headless browser's `--dump-dom` shows
//! them, which is how the tests check a report in Chromium.

use std::fmt::Write;

/// A piece of the report, in order.
pub enum Block {
    Heading(String),
    Paragraph(String),
    /// Preformatted text (the tables duet prints).
    Pre(String),
    /// A table: header cells, then rows.
    Table(Vec<String>, Vec<Vec<String>>),
    /// An SVG document with its caption.
    Figure {
        caption: String,
        svg: String,
    },
}

pub struct Report {
    pub title: String,
    pub blocks: Vec<Block>,
}

/// `s` escaped for HTML and SVG text and attribute values.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

const STYLE: &str = "body{font-family:sans-serif;margin:2em;color:#222;max-width:1400px}\
pre{background:#f6f6f6;padding:.8em;overflow-x:auto}\
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:right}\
th{background:#eee}figure{margin:1.5em 0;overflow-x:auto}figcaption{color:#555;margin-top:.3em}";

/// Counts figures and rendered figures after load, and collects errors, into <body>'s
/// attributes.
const CHECK_SCRIPT: &str = r#"
(function () {
  var errors = [];
  window.addEventListener('error', function (e) {
    errors.push(String(e.message || e.type));
    document.body.setAttribute('data-errors', errors.join(' | '));
  }, true);
  window.addEventListener('load', function () {
    var figs = document.querySelectorAll('figure.duet-figure > svg');
    var rendered = 0;
    figs.forEach(function (svg) {
      var b = svg.getBBox();
      if (b.width > 0 && b.height > 0) rendered++;
    });
    document.body.setAttribute('data-figures', String(figs.length));
    document.body.setAttribute('data-rendered', String(rendered));
  });
})();
"#;

/// Removes an XML declaration or doctype before an SVG document's root, so it can be
/// inlined.
fn inline_svg(svg: &str) -> &str {
    svg.find("<svg").map_or(svg, |i| &svg[i..])
}

pub fn render(r: &Report) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'\">\
         <title>{}</title><style>{STYLE}</style><script>{CHECK_SCRIPT}</script></head>\n<body>\n<h1>{}</h1>\n",
        esc(&r.title),
        esc(&r.title)
    );
    for b in &r.blocks {
        match b {
            Block::Heading(h) => {
                let _ = writeln!(s, "<h2>{}</h2>", esc(h));
            }
            Block::Paragraph(p) => {
                let _ = writeln!(s, "<p>{}</p>", esc(p));
            }
            Block::Pre(t) => {
                let _ = writeln!(s, "<pre>{}</pre>", esc(t));
            }
            Block::Table(head, rows) => {
                s.push_str("<table><thead><tr>");
                for h in head {
                    let _ = write!(s, "<th>{}</th>", esc(h));
                }
                s.push_str("</tr></thead><tbody>\n");
                for row in rows {
                    s.push_str("<tr>");
                    for c in row {
                        let _ = write!(s, "<td>{}</td>", esc(c));
                    }
                    s.push_str("</tr>\n");
                }
                s.push_str("</tbody></table>\n");
            }
            Block::Figure { caption, svg } => {
                let _ = writeln!(
                    s,
                    "<figure class=\"duet-figure\">{}<figcaption>{}</figcaption></figure>",
                    inline_svg(svg),
                    esc(caption)
                );
            }
        }
    }
    s.push_str("</body></html>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_inlines_figures_and_escapes_text() {
        let r = Report {
            title: "a <b>".into(),
            blocks: vec![
                Block::Table(vec!["x".into()], vec![vec!["1 < 2".into()]]),
                Block::Figure { caption: "c".into(), svg: "<?xml version=\"1.0\"?>\n<svg></svg>".into() },
                Block::Figure { caption: "d".into(), svg: "<svg></svg>".into() },
            ],
        };
        let h = render(&r);
        assert_eq!(h.matches("<figure class=\"duet-figure\"><svg>").count(), 2);
        assert!(h.contains("<h1>a &lt;b&gt;</h1>") && h.contains("<td>1 &lt; 2</td>"));
        assert!(!h.contains("<?xml") && !h.contains("http://") && !h.contains("https://"));
    }
}
