//! The conversion pipeline: plan every tensor, then stream them one at a time into a GGUF
//! that replaces the output path only when complete.
//!
//! Peak memory, whatever the model size: three tensors' output bytes (one being made, one
//! queued, one being written), the source pages in use (released after each tensor), and
//! f32 values of a whole tensor only for computed ones (DEX folds, RoPE factors): every
//! other matrix, from a GGUF or a checkpoint, is re-quantized a few rows at a time.

use std::path::{Path, PathBuf};

use duet_quant::GgmlType;
use duet_quant::gguf::{GgufFile, GgufWriter, Value};
use duet_runtime::gguf_names::{self, keys};

use crate::error::ConvertError;
use crate::hf_config::{HfConfig, RopeScaling};
use crate::imatrix::Imatrix;
use crate::mapping::{self, MappingOptions, OutTensor};
use crate::pipeline;
use crate::quant_plan::{Category, Override, Planner, Preset, llama_cpp_order};
use crate::quantize_rows::{quantize_rows, requantize_rows};
use crate::safetensors::Checkpoint;
use crate::tokenizer;

/// What the user asked for.
#[derive(Clone, Debug)]
pub struct Options {
    /// An HF model directory or an existing .gguf file.
    pub input: PathBuf,
    pub preset: Preset,
    pub overrides: Vec<Override>,
    pub imatrix: Option<PathBuf>,
    pub keep_dex: bool,
    /// Worker threads for quantization (0: all cores).
    pub threads: usize,
    /// Overrides general.name.
    pub name: Option<String>,
}

/// Receives progress events; the CLI draws a bar from them.
pub trait Progress {
    fn begin(&self, _total_bytes: u64, _n_tensors: usize) {}
    fn tensor(&self, _name: &str, _ty: GgmlType, _bytes: u64) {}
    fn advance(&self, _bytes: u64) {}
    fn warn(&self, msg: &str) {
        eprintln!("warning: {msg}");
    }
}

/// No progress output (tests, dry runs).
pub struct Quiet;
impl Progress for Quiet {
    fn warn(&self, _msg: &str) {}
}

/// One tensor of the output file.
#[derive(Clone, Debug)]
pub struct PlannedTensor {
    pub name: String,
    /// GGUF dims, fastest first.
    pub dims: Vec<usize>,
    pub ty: GgmlType,
    pub n_bytes: u64,
    source: Source,
}

#[derive(Clone, Debug)]
enum Source {
    Hf(OutTensor),
    /// Index of a tensor in the input GGUF; `copy` when its bytes are reused unchanged.
    Gguf {
        index: usize,
        copy: bool,
    },
}

enum Input {
    Hf {
        ckpt: Checkpoint,
    },
    /// `data` maps the same file as `file`: tensors are read through it so that their pages
    /// can be released after use (as [`Checkpoint::release`] does), which `GgufFile`'s own
    /// map does not offer. Without it a re-quantization keeps the whole source resident.
    Gguf {
        file: GgufFile,
        data: memmap2::Mmap,
    },
}

/// A fully planned conversion: nothing has been written yet.
pub struct Conversion {
    input: Input,
    input_files: Vec<PathBuf>,
    metadata: Vec<(String, Value)>,
    tensors: Vec<PlannedTensor>,
    imatrix: Option<Imatrix>,
    /// Warnings found while planning (e.g. requantizing from lower precision).
    pub warnings: Vec<String>,
    pub arch: String,
}

impl Conversion {
    pub fn prepare(opts: &Options) -> Result<Conversion, ConvertError> {
        let imatrix = opts.imatrix.as_deref().map(Imatrix::load).transpose()?;
        Conversion::prepare_with_imatrix(opts, imatrix)
    }

    /// [`Conversion::prepare`] with an importance matrix already in memory.
    pub fn prepare_with_imatrix(opts: &Options, imatrix: Option<Imatrix>) -> Result<Conversion, ConvertError> {
        let mut conv = if opts.input.is_dir() {
            prepare_hf(opts, imatrix)?
        } else if opts.input.extension().is_some_and(|e| e == "safetensors" || e == "json") {
            return Err(ConvertError::Usage(format!(
                "{} is one file of a checkpoint: pass the model directory that holds it (with config.json and the tokenizer files)",
                opts.input.display()
            )));
        } else if opts.input.is_file() {
            prepare_gguf(opts, imatrix)?
        } else {
            return Err(ConvertError::missing(&opts.input, "no such file or directory"));
        };
        // The importance matrix is an input too: writing over it must be refused.
        conv.input_files.extend(opts.imatrix.iter().cloned());
        Ok(conv)
    }

    /// Adds metadata keys to the output (after the planned ones).
    pub fn add_metadata(&mut self, kvs: Vec<(String, Value)>) {
        self.metadata.extend(kvs);
    }

    /// Another file the output must not overwrite.
    pub fn add_input_file(&mut self, path: PathBuf) {
        self.input_files.push(path);
    }

    pub fn tensors(&self) -> &[PlannedTensor] {
        &self.tensors
    }

    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    fn writer(&self, out: &Path) -> Result<GgufWriter, ConvertError> {
        let mut w = GgufWriter::new(out);
        for (k, v) in &self.metadata {
            w.add(k.clone(), v.clone())?;
        }
        for t in &self.tensors {
            let dims: Vec<u64> = t.dims.iter().map(|&d| d as u64).collect();
            w.add_tensor(t.name.clone(), &dims, t.ty)?;
        }
        Ok(w)
    }

    /// Size of the file [`Conversion::write`] would produce.
    pub fn file_size(&self) -> Result<u64, ConvertError> {
        Ok(self.writer(Path::new("size-only.gguf"))?.file_size())
    }

    /// Writes the GGUF to `out` (atomically: a temp file renamed at the end). Each tensor
    /// is quantized by `threads` threads (0: all cores) while the previous one is written
    /// ([`crate::pipeline`]).
    pub fn write(&self, out: &Path, threads: usize, progress: &dyn Progress) -> Result<(), ConvertError> {
        self.refuse_overwriting_input(out)?;
        let writer = self.writer(out)?;
        for w in &self.warnings {
            progress.warn(w);
        }
        progress.begin(self.tensors.iter().map(|t| t.n_bytes).sum(), self.tensors.len());
        let threads = if threads == 0 { std::thread::available_parallelism().map_or(1, |n| n.get()) } else { threads };
        let data = writer.start()?;
        pipeline::write_all(
            data,
            &self.tensors,
            |t| &t.name,
            |t, buf| {
                progress.tensor(&t.name, t.ty, t.n_bytes);
                self.produce(t, threads, buf)?;
                progress.advance(t.n_bytes);
                Ok(())
            },
        )
    }

    /// Refuses an output that would replace one of the conversion's inputs (the same file,
    /// through any path or link) or something that is not a regular file (a device, FIFO,
    /// directory or symbolic link): duet_quant::output.
    fn refuse_overwriting_input(&self, out: &Path) -> Result<(), ConvertError> {
        if self.input_files.iter().any(|f| duet_quant::output::same_file(out, f)) {
            return Err(ConvertError::Usage(format!(
                "refusing to overwrite the input file {} (choose another output path)",
                out.display()
            )));
        }
        duet_quant::output::check_target(out, &[]).map_err(|e| ConvertError::Usage(e.to_string()))
    }

    /// The bytes of one output tensor, into `out` (resized to them).
    fn produce(&self, t: &PlannedTensor, threads: usize, out: &mut Vec<u8>) -> Result<(), ConvertError> {
        let qerr = |source| ConvertError::Quant { tensor: t.name.clone(), source };
        let n_per_row = t.dims[0];
        let imatrix = self.imatrix_for(&t.name, n_per_row);
        out.clear();
        match (&t.source, &self.input) {
            (Source::Hf(o), Input::Hf { ckpt }) => {
                out.resize(t.n_bytes as usize, 0);
                // A matrix that is one checkpoint tensor's rows is read row by row in the
                // threads; anything computed goes through f32 values of the whole tensor.
                let rows = mapping::source_rows(o).and_then(|(name, order)| Some((ckpt.meta(name)?, order)));
                let r = match rows {
                    Some((meta, order)) => {
                        let (raw, src_ty) = (ckpt.raw(meta), meta.dtype.ggml_type());
                        requantize_rows(raw, src_ty, n_per_row, &|r| order.source(r), t.ty, imatrix, threads, out)
                    }
                    None => {
                        let values = mapping::materialize(o, ckpt)?;
                        quantize_rows(&values, n_per_row, t.ty, imatrix, threads, out)
                    }
                };
                for n in mapping::source_names(o) {
                    if let Some(m) = ckpt.meta(n) {
                        ckpt.release(m);
                    }
                }
                r.map_err(qerr)
            }
            (Source::Gguf { index, copy }, Input::Gguf { file, data }) => {
                let info = &file.tensors()[*index];
                let (start, len) = (info.file_offset() as usize, info.n_bytes() as usize);
                let raw = &data[start..start + len];
                let r = if *copy {
                    out.extend_from_slice(raw);
                    Ok(())
                } else {
                    out.resize(t.n_bytes as usize, 0);
                    requantize_rows(raw, info.ggml_type(), n_per_row, &|r| r, t.ty, imatrix, threads, out).map_err(qerr)
                };
                // SAFETY: DontNeed on a read-only file mapping only drops clean pages; later
                // reads fault them back in from the file. Best effort.
                #[cfg(unix)]
                let _ = unsafe { data.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, len) };
                r
            }
            _ => unreachable!("a planned tensor always matches its input kind"),
        }
    }

    fn imatrix_for(&self, name: &str, n_per_row: usize) -> Option<&[f32]> {
        self.imatrix.as_ref()?.get(name).filter(|v| v.len() == n_per_row)
    }
}

fn prepare_hf(opts: &Options, imatrix: Option<Imatrix>) -> Result<Conversion, ConvertError> {
    let dir = &opts.input;
    let cfg = HfConfig::load(dir)?;
    let ckpt = Checkpoint::open_dir(dir)?;
    // The tensors first: they pin vocab_size to the embedding's rows, which the file's size
    // bounds, before the tokenizer sizes its arrays by it.
    let outs = mapping::plan(&cfg, &ckpt, MappingOptions { keep_dex: opts.keep_dex })?;
    let tok = tokenizer::load(dir, cfg.vocab_size, cfg.bos_token_id, &cfg.eos_token_ids)?;

    let has_imatrix = imatrix.is_some();
    let mut planner = Planner::new(opts.preset, cfg.n_layers, cfg.tie_word_embeddings, has_imatrix, &opts.overrides);
    // Types are chosen in llama-quantize's order (the mixing rules count tensors).
    let mut types = vec![GgmlType::F32; outs.len()];
    let names: Vec<&str> = outs.iter().map(|o| o.name.as_str()).collect();
    for i in llama_cpp_order(&names) {
        let o = &outs[i];
        types[i] = planner.choose(&o.name, o.dims.len(), o.dims[0]);
    }
    let mut tensors = Vec::with_capacity(outs.len());
    for (o, ty) in outs.into_iter().zip(types) {
        let n_bytes = ty.bytes_for(o.numel() as u64).ok_or_else(|| {
            ConvertError::shape(format!("tensor '{}' of shape {:?} does not fit {ty} blocks", o.name, o.dims))
        })?;
        tensors.push(PlannedTensor { name: o.name.clone(), dims: o.dims.clone(), ty, n_bytes, source: Source::Hf(o) });
    }

    let arch = cfg.arch.name();
    let a = |k: &str| gguf_names::key(cfg.arch, k);
    let name = opts.name.clone().unwrap_or_else(|| cfg.name.clone());
    let mut md: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(arch.into())),
        ("general.name".into(), Value::String(name)),
        ("general.file_type".into(), Value::U32(opts.preset.file_type())),
        ("general.quantization_version".into(), Value::U32(2)),
        (a(keys::CONTEXT_LENGTH), Value::U32(cfg.max_position_embeddings as u32)),
        (a(keys::EMBEDDING_LENGTH), Value::U32(cfg.hidden_size as u32)),
        (a(keys::BLOCK_COUNT), Value::U32(cfg.n_layers as u32)),
        (a(keys::FEED_FORWARD_LENGTH), Value::U32(cfg.intermediate_size as u32)),
        // Query heads (V2: both heads of every pair, as the runtime attends over them).
        (a(keys::HEAD_COUNT), Value::U32(cfg.q_heads() as u32)),
        (a(keys::HEAD_COUNT_KV), Value::U32(cfg.n_kv_heads as u32)),
        (a(keys::KEY_LENGTH), Value::U32(cfg.head_dim as u32)),
        (a(keys::VALUE_LENGTH), Value::U32(cfg.head_dim as u32)),
        (a(keys::ROPE_DIMENSION_COUNT), Value::U32(cfg.head_dim as u32)),
        (a(keys::ROPE_FREQ_BASE), Value::F32(cfg.rope_theta)),
        (a(keys::RMS_EPSILON), Value::F32(cfg.rms_norm_eps)),
        (a(keys::VOCAB_SIZE), Value::U32(cfg.vocab_size as u32)),
    ];
    if let Some(RopeScaling::Linear { factor }) = cfg.rope_scaling {
        md.push((a(keys::ROPE_SCALING_TYPE), Value::String("linear".into())));
        md.push((a(keys::ROPE_SCALING_FACTOR), Value::F32(factor)));
    }
    if let (Some(dex), true) = (&cfg.dex, opts.keep_dex) {
        // One byte per (layer, head): 1 where DEX applies. Only duet reads this key.
        let mut mask = vec![0u8; cfg.n_layers * cfg.n_heads];
        for (l, heads) in dex.heads.iter().enumerate() {
            for &h in heads {
                mask[l * cfg.n_heads + h] = 1;
            }
        }
        md.push((gguf_names::DEX_HEAD_MASK.into(), Value::Array(duet_quant::gguf::Array::U8(mask))));
    }
    md.extend(tok.kvs);
    if !tok.eog_ids.is_empty() {
        md.push(("duet.eog_token_ids".into(), Value::Array(duet_quant::gguf::Array::U32(tok.eog_ids))));
    }
    let input_files = ckpt_files(dir);
    Ok(Conversion {
        input: Input::Hf { ckpt },
        input_files,
        metadata: md,
        tensors,
        imatrix,
        warnings: vec![],
        arch: arch.into(),
    })
}

/// Every file in the input directory (the output must not replace any of them).
fn ckpt_files(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.is_file()).collect())
        .unwrap_or_default()
}

/// Bits per weight, to tell a precision increase from a decrease.
fn bits_per_weight(t: GgmlType) -> f64 {
    t.type_size() as f64 * 8.0 / t.block_size() as f64
}

fn prepare_gguf(opts: &Options, imatrix: Option<Imatrix>) -> Result<Conversion, ConvertError> {
    let file = GgufFile::open(&opts.input)?;
    let data = {
        let f = std::fs::File::open(&opts.input).map_err(|e| ConvertError::io(&opts.input, e))?;
        // SAFETY: read-only, like GgufFile's own map of the same file.
        unsafe { memmap2::Mmap::map(&f) }.map_err(|e| ConvertError::io(&opts.input, e))?
    };
    if (data.len() as u64) < file.file_size() {
        return Err(ConvertError::corrupt(&opts.input, "the file changed while it was being read"));
    }
    let arch = file.get_str("general.architecture")?.to_string();
    let n_layers = file.get_u32(&format!("{arch}.{}", keys::BLOCK_COUNT))? as usize;
    let tied = file.tensor(gguf_names::OUTPUT).is_none();
    let mut planner = Planner::new(opts.preset, n_layers, tied, imatrix.is_some(), &opts.overrides);
    let mut warnings = Vec::new();
    let mut tensors = Vec::with_capacity(file.tensors().len());
    let mut widened = Vec::new();
    // Types are chosen in llama-quantize's order (the mixing rules count tensors); the
    // output keeps the input's tensor order.
    let names: Vec<&str> = file.tensors().iter().map(|t| t.name()).collect();
    let mut planned_types = vec![GgmlType::F32; names.len()];
    for i in llama_cpp_order(&names) {
        let info = &file.tensors()[i];
        planned_types[i] = planner.choose(info.name(), info.dims().len(), info.dims()[0] as usize);
    }
    for (index, info) in file.tensors().iter().enumerate() {
        let dims: Vec<usize> = info.dims().iter().map(|&d| d as usize).collect();
        let src_ty = info.ggml_type();
        let planned = planned_types[index];
        // Like llama-quantize: tensors that are never quantized keep their bytes.
        let keep = Category::of(info.name(), dims.len()) == Category::KeepF32 || planned == src_ty;
        let ty = if keep { src_ty } else { planned };
        if !keep && !src_ty.is_supported() {
            return Err(ConvertError::unsupported(format!(
                "{}: tensor '{}' is {src_ty}, which duet cannot dequantize",
                opts.input.display(),
                info.name()
            )));
        }
        if !keep && bits_per_weight(ty) > bits_per_weight(src_ty) {
            widened.push(format!("{} ({src_ty} → {ty})", info.name()));
        }
        tensors.push(PlannedTensor {
            name: info.name().to_string(),
            dims,
            ty,
            n_bytes: info.n_bytes(),
            source: Source::Gguf { index, copy: keep },
        });
        let t = tensors.last_mut().expect("just pushed");
        t.n_bytes = ty.bytes_for(t.dims.iter().product::<usize>() as u64).unwrap_or(t.n_bytes);
    }
    if !widened.is_empty() {
        warnings.push(format!(
            "{} tensor(s) go from a lower-precision type to a higher one, which cannot restore the lost precision (e.g. {})",
            widened.len(),
            widened[0]
        ));
    }
    let mut md: Vec<(String, Value)> = Vec::new();
    for (k, v) in file.metadata() {
        match k {
            "general.file_type" | "general.quantization_version" | "general.alignment" => {}
            _ => md.push((k.to_string(), v.clone())),
        }
    }
    md.push(("general.file_type".into(), Value::U32(opts.preset.file_type())));
    md.push(("general.quantization_version".into(), Value::U32(2)));
    if let Some(n) = &opts.name {
        md.retain(|(k, _)| k != "general.name");
        md.push(("general.name".into(), Value::String(n.clone())));
    }
    Ok(Conversion {
        input_files: vec![opts.input.clone()],
        input: Input::Gguf { file, data },
        metadata: md,
        tensors,
        imatrix,
        warnings,
        arch,
    })
}
