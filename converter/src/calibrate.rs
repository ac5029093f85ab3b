//! `duet convert --calibrate TEXT`: run the model over text on duet's CPU runtime, record
//! activation statistics and the importance matrix, then quantize with that matrix and store
//! the statistics in the output (keys in `duet_runtime::tools::calibrate`).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use duet_quant::gguf::GgufFile;
use duet_runtime::backend::Backend;
use duet_runtime::cpu::CpuBackend;
use duet_runtime::kv_cache::CacheFormat;
use duet_runtime::model::{Logits, Model};
use duet_runtime::text::Tokenizer;
use duet_runtime::tools::calibrate::{CalibrationReport, Calibrator};

use crate::convert::{Conversion, Options, Progress, Quiet};
use crate::error::ConvertError;
use crate::imatrix::Imatrix;
use crate::quant_plan::Preset;

#[derive(Clone, Debug)]
pub struct CalibrateOptions {
    /// Text file to run the model over.
    pub text: PathBuf,
    /// Tokens per chunk (each chunk starts from an empty cache).
    pub ctx: usize,
    /// Stop after this many tokens (0: the whole text).
    pub max_tokens: usize,
    /// CPU threads (0: all).
    pub threads: usize,
}

fn runtime_err(path: &Path, e: duet_runtime::RuntimeError) -> ConvertError {
    ConvertError::corrupt(path, format!("calibration run failed: {e}"))
}

/// Runs `gguf` (any type duet can compute with) over the text and returns its statistics.
pub fn calibrate_gguf(
    gguf: &Path,
    cal: &CalibrateOptions,
    progress: &dyn Progress,
) -> Result<CalibrationReport, ConvertError> {
    let text = duet_quant::input::read_text(&cal.text, duet_quant::input::MAX_TEXT_BYTES)
        .map_err(|e| ConvertError::io(&cal.text, e))?;
    let file = Arc::new(GgufFile::open(gguf)?);
    let mut b = CpuBackend::new(cal.threads);
    let model = Model::load(&mut b, Arc::clone(&file)).map_err(|e| runtime_err(gguf, e))?;
    let tok = Tokenizer::from_gguf(&file).map_err(|e| runtime_err(gguf, e))?;
    let mut tokens = tok.encode(&text, tok.add_bos).map_err(|e| runtime_err(&cal.text, e))?;
    if cal.max_tokens > 0 {
        tokens.truncate(cal.max_tokens);
    }
    if tokens.len() < 2 {
        return Err(ConvertError::Usage(format!("{}: too little text to calibrate on", cal.text.display())));
    }
    let ctx = cal.ctx.max(2).min(model.config.n_ctx_train.max(2));
    let mut session =
        model.new_session(&mut b, ctx, CacheFormat::F32, CacheFormat::F32).map_err(|e| runtime_err(gguf, e))?;
    let mut context = model.new_context(&mut b, ctx).map_err(|e| runtime_err(gguf, e))?;
    let calibrator = Arc::new(Mutex::new(Calibrator::new(&model.config)));
    b.set_observer(Some(Box::new(Arc::clone(&calibrator))));
    let chunks: Vec<&[u32]> = tokens.chunks(ctx).collect();
    progress.begin(tokens.len() as u64, chunks.len());
    for chunk in chunks {
        progress.tensor("calibration", duet_quant::GgmlType::F32, chunk.len() as u64);
        session.reset();
        model.decode_one(&mut b, &mut context, &mut session, chunk, Logits::All).map_err(|e| runtime_err(gguf, e))?;
        progress.advance(chunk.len() as u64);
    }
    b.set_observer(None);
    let source = cal.text.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let report = calibrator.lock().unwrap_or_else(|e| e.into_inner()).report(&source);
    Ok(report)
}

impl Conversion {
    /// Plans a conversion whose K-quants are weighted by an importance matrix measured on
    /// `cal.text`, and whose output carries the calibration statistics. HF checkpoints are
    /// first converted to a temporary F16 GGUF to run on.
    pub fn prepare_calibrated(
        opts: &Options,
        cal: &CalibrateOptions,
        progress: &dyn Progress,
    ) -> Result<(Conversion, CalibrationReport), ConvertError> {
        if opts.imatrix.is_some() {
            return Err(ConvertError::Usage("--calibrate measures its own importance matrix: drop --imatrix".into()));
        }
        let report = if opts.input.is_dir() {
            // A fresh name of this process's own, removed when done, on error and (through
            // duet_quant::output::remove_pending_before_exit) on an interrupting signal.
            let tmp = duet_quant::output::TempPath::new_in(&std::env::temp_dir(), "duet-calibrate", ".f16.gguf")
                .map_err(|e| ConvertError::Usage(format!("cannot create calibration's temporary model: {e}")))?;
            let f16 = Options { preset: Preset::F16, overrides: vec![], ..opts.clone() };
            Conversion::prepare(&f16)?.write(tmp.path(), opts.threads, &Quiet)?;
            calibrate_gguf(tmp.path(), cal, progress)?
        } else {
            calibrate_gguf(&opts.input, cal, progress)?
        };
        let imatrix = Imatrix { entries: report.imatrix.clone().into_iter().collect() };
        let mut conv = Conversion::prepare_with_imatrix(opts, Some(imatrix))?;
        conv.add_metadata(report.to_metadata());
        conv.add_input_file(cal.text.clone());
        Ok((conv, report))
    }
}
