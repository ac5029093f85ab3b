//! `duet attn-map`: the attention maps of selected layers and heads over a prompt, and the
//! files that show them (SVG and PNG heatmaps, raw maps as .npy with a JSON index, an HTML
//! report).

use serde_json::{Value, json};

use crate::backend::Backend;
use crate::engine::Engine;
use crate::error::RuntimeError;
use crate::tools::insight::heatmap::{self, Figure, Panel};
use crate::tools::insight::html::{self, Block, Report};
use crate::tools::insight::maps::{HeadMaps, head_maps, is_paired, selectable_heads};
use crate::tools::insight::{capture_qk, npy, raster};

/// The maps of one prompt.
pub struct MapSet {
    /// The model file's name and architecture.
    pub model: String,
    pub arch: String,
    pub tokens: Vec<u32>,
    /// Each token's text.
    pub token_text: Vec<String>,
    /// Whether heads are shown in pairs (DIFF: query heads j and j + n_query_heads/2; V2: 2j
    /// and 2j + 1).
    pub differential: bool,
    pub n_query_heads: usize,
    /// One entry per selected (layer, head), layer-major.
    pub heads: Vec<HeadMaps>,
}

/// Checks `layers` and `heads` against the model (None: all of them) and returns them.
fn selection<B: Backend>(
    engine: &Engine<B>,
    layers: Option<&[usize]>,
    heads: Option<&[usize]>,
) -> Result<(Vec<usize>, Vec<usize>), RuntimeError> {
    let n_layers = engine.model.layers.len();
    let layers = layers.map_or_else(|| (0..n_layers).collect(), <[usize]>::to_vec);
    if let Some(&l) = layers.iter().find(|&&l| l >= n_layers) {
        return Err(RuntimeError::Usage(format!(
            "layer {l} is out of range: the model has {n_layers} layers (0 to {})",
            n_layers - 1
        )));
    }
    let spec = &engine.model.layers[0].attention;
    let n_heads = selectable_heads(spec);
    let unit = if is_paired(spec) { "DIFF head pairs" } else { "heads" };
    let heads = heads.map_or_else(|| (0..n_heads).collect(), <[usize]>::to_vec);
    if let Some(&h) = heads.iter().find(|&&h| h >= n_heads) {
        return Err(RuntimeError::Usage(format!(
            "head {h} is out of range: the model's layers have {n_heads} {unit} (0 to {})",
            n_heads - 1
        )));
    }
    Ok((layers, heads))
}

/// Runs `tokens` (at most the context) and computes the maps of the selected layers and
/// heads (None: all) over all of them, refusing before any work maps that would take more
/// than `max_bytes`.
pub fn attention_maps<B: Backend>(
    engine: &mut Engine<B>,
    model: &str,
    tokens: &[u32],
    layers: Option<&[usize]>,
    heads: Option<&[usize]>,
    max_bytes: u64,
) -> Result<MapSet, RuntimeError> {
    let (layers, heads) = selection(engine, layers, heads)?;
    if tokens.is_empty() {
        return Err(RuntimeError::Usage("the prompt is empty".into()));
    }
    if tokens.len() > engine.n_ctx() {
        return Err(RuntimeError::Usage(format!(
            "the prompt is {} tokens but the context holds {} (raise -c/--ctx-size or shorten the prompt)",
            tokens.len(),
            engine.n_ctx()
        )));
    }
    let per_head = if is_paired(&engine.model.layers[0].attention) { 3 } else { 1 };
    let bytes = (layers.len() * heads.len() * per_head) as u64 * (tokens.len() as u64).pow(2) * 4;
    if bytes > max_bytes {
        return Err(RuntimeError::Usage(format!(
            "{} tokens × {} layers × {} heads make {:.1} GiB of maps, more than {:.1} GiB: select fewer with --layers/--heads or shorten the prompt",
            tokens.len(),
            layers.len(),
            heads.len(),
            bytes as f64 / (1u64 << 30) as f64,
            max_bytes as f64 / (1u64 << 30) as f64
        )));
    }
    let mut wanted = vec![false; engine.model.layers.len()];
    for &l in &layers {
        wanted[l] = true;
    }
    let capture = capture_qk(engine, tokens, wanted)?;
    let positions: Vec<usize> = (0..tokens.len()).collect();
    let mut out = Vec::new();
    for &l in &layers {
        for &h in &heads {
            out.push(head_maps(capture.layer(l), &engine.model.layers[l].attention, l, h, &positions));
        }
    }
    let token_text = tokens.iter().map(|&t| engine.tokenizer.decode(&[t], true)).collect::<Result<_, _>>()?;
    Ok(MapSet {
        model: model.to_string(),
        arch: engine.model.config.arch.name().to_string(),
        tokens: tokens.to_vec(),
        token_text,
        differential: is_paired(&engine.model.layers[0].attention),
        n_query_heads: engine.model.layers[0].attention.n_heads,
        heads: out,
    })
}

impl MapSet {
    fn unit(&self) -> &'static str {
        if self.differential { "pair" } else { "head" }
    }

    /// The file stem of one entry: `layer03-head1` or `layer03-pair1`.
    pub fn stem(&self, m: &HeadMaps) -> String {
        format!("layer{:02}-{}{}", m.layer, self.unit(), m.head)
    }

    pub fn figure<'a>(&'a self, m: &'a HeadMaps) -> Figure<'a> {
        // V2's λ is each token's own: the title gives their mean.
        let lambda_label = if self.arch == "diffllama_v2" { "mean λₜ" } else { "λ" };
        let title = match (m.pair, m.lambda) {
            (Some((a, b)), Some(l)) => format!(
                "{}: layer {}, pair {} (heads {a} and {b}), {lambda_label} = {l:.3}",
                self.model, m.layer, m.head
            ),
            _ => format!("{}: layer {}, head {}", self.model, m.layer, m.head),
        };
        Figure {
            title,
            panels: m.maps.iter().map(|x| Panel { title: x.name.clone(), map: x }).collect(),
            row_labels: self.token_text.clone(),
            col_labels: self.token_text.clone(),
        }
    }

    /// Every output file as (name, bytes): per entry STEM.svg and STEM.png; per layer
    /// layerNN.npy (selected heads × maps per head × tokens × tokens, f32); maps.json, the
    /// index that says which slice of which file is which map; with `with_html`,
    /// report.html, whose figures are the same SVGs.
    pub fn files(&self, with_html: bool) -> Vec<(String, Vec<u8>)> {
        let mut files = Vec::new();
        let mut figures = Vec::new();
        for m in &self.heads {
            let fig = self.figure(m);
            let svg = heatmap::to_svg(&fig);
            files.push((format!("{}.png", self.stem(m)), raster::figure_png(&fig)));
            if with_html {
                figures.push(Block::Figure { caption: fig.title.clone(), svg: svg.clone() });
            }
            files.push((format!("{}.svg", self.stem(m)), svg.into_bytes()));
        }
        if with_html {
            files.push(("report.html".into(), html::render(&self.report(figures)).into_bytes()));
        }
        let n = self.tokens.len();
        let mut entries = Vec::new();
        let mut layers: Vec<usize> = self.heads.iter().map(|m| m.layer).collect();
        layers.dedup();
        for &l in &layers {
            let in_layer: Vec<&HeadMaps> = self.heads.iter().filter(|m| m.layer == l).collect();
            let per_head = in_layer[0].maps.len();
            let mut data = Vec::with_capacity(in_layer.len() * per_head * n * n);
            let npy_name = format!("layer{l:02}.npy");
            for (i, m) in in_layer.iter().enumerate() {
                for x in &m.maps {
                    data.extend_from_slice(&x.data);
                }
                let mut entry = json!({
                    "layer": l,
                    self.unit(): m.head,
                    "lambda": m.lambda,
                    "maps": m.maps.iter().map(|x| x.name.clone()).collect::<Vec<_>>(),
                    "npy": npy_name,
                    "npy_index": i,
                    "svg": format!("{}.svg", self.stem(m)),
                    "png": format!("{}.png", self.stem(m)),
                });
                if let Some((a, b)) = m.pair {
                    entry["query_heads"] = json!([a, b]);
                }
                if !m.row_lambdas.is_empty() {
                    entry["row_lambda"] = json!(m.row_lambdas);
                }
                entries.push(entry);
            }
            files.push((npy_name, npy::to_npy(&[in_layer.len(), per_head, n, n], &data)));
        }
        let index: Value = json!({
            "model": self.model,
            "arch": self.arch,
            "differential": self.differential,
            "n_query_heads": self.n_query_heads,
            "tokens": self.tokens.iter().zip(&self.token_text).map(|(id, t)| json!({"id": id, "text": t})).collect::<Vec<_>>(),
            "note": "map[i][j]: the weight query position i gives key position j (0 past i). Standard heads: softmax(scale·q·kᵀ); DIFF pairs: A1, A2 and A1 − λ·A2 (rows sum to 1 − λ); DIFF V2 pairs: A₂ᵢ, A₂ᵢ₊₁ and A₂ᵢ − λₜ·A₂ᵢ₊₁ with each row's own λₜ in row_lambda (rows sum to 1 − λₜ; lambda is their mean). From f32 Q/K after RoPE, before the K cache's rounding and without logit quantization.",
            "entries": entries,
        });
        let json = serde_json::to_string_pretty(&index).expect("JSON of plain values");
        files.push(("maps.json".into(), json.into_bytes()));
        files
    }

    /// The HTML report: `figures` (one per entry), after the prompt's tokens.
    fn report(&self, figures: Vec<Block>) -> Report {
        let mut blocks = vec![Block::Paragraph(format!(
            "{} ({}), {} tokens. Rows are query positions, columns key positions; colours on square-root scales (the colour bars give the values).{}",
            self.model,
            self.arch,
            self.tokens.len(),
            if self.differential {
                " DIFF head pairs: A1, A2 and A1 − λ·A2, whose rows sum to 1 − λ."
            } else {
                ""
            }
        ))];
        blocks.push(Block::Pre(
            self.token_text.iter().enumerate().map(|(i, t)| format!("{i}:{t:?}")).collect::<Vec<_>>().join("  "),
        ));
        blocks.extend(figures);
        Report { title: format!("duet attn-map: {}", self.model), blocks }
    }
}
