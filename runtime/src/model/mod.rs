//! The one model code path for Llama, DiffLlama, DIFF V2 and DEX: a Llama layer skeleton
//! whose attention variant is chosen per layer ([`AttentionKind`]) and whose attention
//! output may pass a combine step (DIFF V2's head pairs, DEX) before attn_output, written
//! once against [`Backend`].

mod batch;
pub(crate) use batch::check_context;
mod load;
pub mod source;
mod step;

use std::sync::{Arc, Mutex, MutexGuard};

use duet_quant::gguf::GgufFile;

pub use crate::model_config::{Arch, ModelConfig, RopeConfig};
pub use batch::{Batch, BatchContext, BatchSeq};

use crate::backend::{AttentionSpec, Backend, LogitQuant, LogitScale, RopeSpec};
use crate::error::RuntimeError;
use crate::kv_cache::{CacheFormat, KvCacheSpec};
use crate::kv_pages::{PAGE, PagePool, SeqPages};

/// Where the absmax of a logit quantization comes from (see [`LogitScale`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LogitGranularity {
    Tensor,
    Head,
    Row,
    Static,
}

impl LogitGranularity {
    pub const ALL: [LogitGranularity; 4] =
        [LogitGranularity::Tensor, LogitGranularity::Head, LogitGranularity::Row, LogitGranularity::Static];

    pub fn name(self) -> &'static str {
        match self {
            LogitGranularity::Tensor => "tensor",
            LogitGranularity::Head => "head",
            LogitGranularity::Row => "row",
            LogitGranularity::Static => "static",
        }
    }

    pub fn parse(s: &str) -> Option<LogitGranularity> {
        LogitGranularity::ALL.into_iter().find(|g| g.name() == s)
    }
}

/// Weights of one transformer block. Shapes (rows × cols, i.e. out × in) in comments.
pub struct Layer<B: Backend> {
    pub attn_norm: B::Weight, // 1 × n_embd
    pub wq: B::Weight,        // n_heads·hd × n_embd
    pub wk: B::Weight,        // n_kv_heads·hd × n_embd
    pub wv: B::Weight,        // n_kv_heads·hd × n_embd
    pub wo: B::Weight,        // n_embd × attn_out_dim (n_heads·hd; V2: n_heads/2·hd)
    pub bq: Option<B::Weight>,
    pub bk: Option<B::Weight>,
    pub bv: Option<B::Weight>,
    pub bo: Option<B::Weight>,
    /// The layer's attention as the weights define it (its `logit_quant` is always None: a
    /// run setting, kept in [`Session::attention`]).
    pub attention: AttentionSpec,
    /// DIFF V2: lambda_proj (n_heads/2 × n_embd). Its output, through a sigmoid, weighs the
    /// second head of each query-head pair ([`Backend::pair_combine`]).
    pub lambda_proj: Option<B::Weight>,
    /// DEX kept unfolded: (W_D hd × hd, λ, adapted heads).
    pub dex: Option<(B::Weight, f32, Vec<usize>)>,
    pub ffn_norm: B::Weight, // 1 × n_embd
    pub w_gate: B::Weight,   // n_ff × n_embd
    pub w_up: B::Weight,     // n_ff × n_embd
    pub w_down: B::Weight,   // n_embd × n_ff
    pub b_gate: Option<B::Weight>,
    pub b_up: Option<B::Weight>,
    pub b_down: Option<B::Weight>,
}

pub struct Model<B: Backend> {
    pub config: ModelConfig,
    pub file: Arc<GgufFile>,
    pub token_embd: B::Weight, // n_vocab × n_embd
    pub output_norm: B::Weight,
    /// None when tied to `token_embd`.
    pub output: Option<B::Weight>, // n_vocab × n_embd
    pub layers: Vec<Layer<B>>,
    pub rope: RopeSpec,
}

/// Which logits a forward pass returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Only the last position's (generation).
    Last,
    /// Every position's (perplexity, logit dumps).
    All,
}

/// A K/V cache and which of its pages and sequence slots are in use: shared by the
/// sessions made together ([`Model::new_sessions`]).
pub struct SharedCache<C> {
    pub kv: C,
    pub pool: PagePool,
}

/// `cache`, locked (a panic elsewhere while it was held does not leave its bookkeeping
/// wrong: every change to it is one whole step).
pub(crate) fn locked<C>(cache: &Mutex<SharedCache<C>>) -> MutexGuard<'_, SharedCache<C>> {
    cache.lock().unwrap_or_else(|p| p.into_inner())
}

/// Per-conversation state: its pages of a (possibly shared) K/V cache, the number of cached
/// positions and its run settings. (The activations a batch flows through belong to the
/// [`BatchContext`] that runs it.)
pub struct Session<B: Backend> {
    /// Each layer's attention as this session runs it: the model's (`Layer::attention`,
    /// never with logit quantization) plus the session's run settings
    /// ([`Model::set_logit_quant`]).
    pub attention: Vec<AttentionSpec>,
    pub cache: Arc<Mutex<SharedCache<B::KvCache>>>,
    /// This session's slot in the cache and its pages (covering positions 0..n_past at
    /// least), given back when it is truncated or dropped.
    slot: usize,
    pages: Vec<u32>,
    /// The sink of this session's first page ([`PagePool::sink`]), kept with `pages`.
    sink: usize,
    /// What the cache holds and how (`n_ctx`: the most positions one session holds).
    pub cache_spec: KvCacheSpec,
    pub n_past: usize,
    pub n_ctx: usize,
}

impl<B: Backend> Model<B> {
    /// Loads a model from an open GGUF file onto `backend`.
    pub fn load(backend: &mut B, file: Arc<GgufFile>) -> Result<Model<B>, RuntimeError> {
        load::load(backend, file)
    }

    /// Loads a model from `src`: a file at hand or a stream ([`source::Streamed`]), which is
    /// then held about one layer at a time.
    pub async fn load_from<S: source::TensorSource>(backend: &mut B, src: &mut S) -> Result<Model<B>, RuntimeError> {
        load::load_from(backend, src).await
    }

    /// Quantizes the attention logits of every layer in `session`'s forward passes (`None`:
    /// full precision). `bits` 2 to 16; `granularity` one of tensor, head, row, or static
    /// (scales from the file's calibration, `duet.calibration.logits.absmax`). A run
    /// setting: it lives in the session, the loaded weights are not changed.
    pub fn set_logit_quant(
        &self,
        session: &mut Session<B>,
        setting: Option<(u32, LogitGranularity)>,
    ) -> Result<(), RuntimeError> {
        let Some((bits, granularity)) = setting else {
            for a in &mut session.attention {
                a.logit_quant = None;
            }
            return Ok(());
        };
        if !(2..=16).contains(&bits) {
            return Err(RuntimeError::Usage(format!("attention-logit bits must be 2 to 16, got {bits}")));
        }
        let c = &self.config;
        let statics = match granularity {
            LogitGranularity::Static => {
                let key = "duet.calibration.logits.absmax";
                let v = match self.file.get(key) {
                    Some(_) => self.file.get_f32_array(key)?.to_vec(),
                    None => {
                        return Err(RuntimeError::Usage(format!(
                            "{} has no attention-logit calibration ({key}): convert it with --calibrate TEXT for static scales",
                            self.file.label()
                        )));
                    }
                };
                if v.len() != c.n_layers * c.n_heads || v.iter().any(|a| !a.is_finite() || *a <= 0.0) {
                    return Err(RuntimeError::BadModel(format!(
                        "{}: {key} must hold {} positive values (n_layers × n_heads), found {}",
                        self.file.label(),
                        c.n_layers * c.n_heads,
                        v.len()
                    )));
                }
                Some(v)
            }
            _ => None,
        };
        let n_heads = c.n_heads;
        for (il, a) in session.attention.iter_mut().enumerate() {
            let scale = match granularity {
                LogitGranularity::Tensor => LogitScale::Tensor,
                LogitGranularity::Head => LogitScale::Head,
                LogitGranularity::Row => LogitScale::Row,
                LogitGranularity::Static => {
                    LogitScale::Static(statics.as_ref().expect("read above")[il * n_heads..(il + 1) * n_heads].to_vec())
                }
            };
            a.logit_quant = Some(LogitQuant { bits, scale });
        }
        Ok(())
    }

    /// The K/V cache of this model for `n_ctx` positions in the given types.
    pub fn cache_spec(&self, n_ctx: usize, k_type: CacheFormat, v_type: CacheFormat) -> KvCacheSpec {
        let c = &self.config;
        KvCacheSpec { n_layers: c.n_layers, n_ctx, n_seqs: 1, kv_dim: c.kv_dim(), head_dim: c.head_dim, k_type, v_type }
    }

    /// A new session with a K/V cache of its own for `n_ctx` positions.
    pub fn new_session(
        &self,
        b: &mut B,
        n_ctx: usize,
        k_type: CacheFormat,
        v_type: CacheFormat,
    ) -> Result<Session<B>, RuntimeError> {
        let mut one = self.new_sessions(b, 1, n_ctx, k_type, v_type)?;
        Ok(one.pop().expect("one session made"))
    }

    /// `n` sessions sharing one paged K/V cache with room for `n_ctx` positions each: a
    /// page is taken when a session writes into it and given back when it truncates or
    /// ends, and full pages of a common prefix are held once ([`Session::share_prefix`]).
    pub fn new_sessions(
        &self,
        b: &mut B,
        n: usize,
        n_ctx: usize,
        k_type: CacheFormat,
        v_type: CacheFormat,
    ) -> Result<Vec<Session<B>>, RuntimeError> {
        let spec = KvCacheSpec { n_seqs: n.max(1), ..self.cache_spec(n_ctx, k_type, v_type) };
        spec.check()?;
        let kv = b.new_kv_cache(&spec)?;
        let mut pool = PagePool::new(spec.n_pages(), spec.n_seqs);
        let slots: Vec<usize> = (0..spec.n_seqs).map(|_| pool.take_slot().expect("a slot per session")).collect();
        let cache = Arc::new(Mutex::new(SharedCache { kv, pool }));
        Ok(slots
            .into_iter()
            .map(|slot| Session {
                attention: self.layers.iter().map(|l| l.attention.clone()).collect(),
                cache: Arc::clone(&cache),
                slot,
                pages: Vec::new(),
                sink: 0,
                cache_spec: spec.clone(),
                n_past: 0,
                n_ctx,
            })
            .collect())
    }
}

impl<B: Backend> Session<B> {
    /// The shared cache, locked.
    pub fn lock_cache(&self) -> MutexGuard<'_, SharedCache<B::KvCache>> {
        locked(&self.cache)
    }

    /// Where this session's positions are in the cache.
    pub fn pages(&self) -> SeqPages<'_> {
        SeqPages { pages: &self.pages, slot: self.slot, sink: self.sink }
    }

    /// Forgets everything: the next forward starts at position 0.
    pub fn reset(&mut self) {
        self.truncate(0);
    }

    /// Drops cached positions from `n` on (they will be overwritten) and returns how many
    /// stay: `n`, or fewer where the cache keeps only whole groups
    /// ([`KvCacheSpec::keepable`]) or the position would be written into a page another
    /// session holds too (then the page is left to it).
    pub fn truncate(&mut self, n: usize) -> usize {
        let mut keep = self.cache_spec.keepable(self.n_past, n);
        let mut c = locked(&self.cache);
        if !keep.is_multiple_of(PAGE) && c.pool.shared(self.pages[keep / PAGE]) {
            keep -= keep % PAGE;
        }
        c.pool.shrink(&mut self.pages, keep);
        self.sink = c.pool.sink(&self.pages);
        self.n_past = keep;
        keep
    }

    /// Makes this session hold the first `n` positions of `other` (a session of the same
    /// cache), as far as they fill whole pages: those pages are then held by both and not
    /// evaluated again. Returns the positions now cached (`n` rounded down to a page).
    pub fn share_prefix(&mut self, other: &Session<B>, n: usize) -> Result<usize, RuntimeError> {
        if !Arc::ptr_eq(&self.cache, &other.cache) {
            return Err(RuntimeError::Usage("share_prefix: the sessions do not share a K/V cache".into()));
        }
        let full = n.min(other.n_past) / PAGE;
        let mut c = locked(&self.cache);
        c.pool.shrink(&mut self.pages, 0);
        self.pages = c.pool.share(&other.pages, full);
        self.sink = c.pool.sink(&self.pages);
        self.n_past = full * PAGE;
        Ok(self.n_past)
    }

    /// Takes the pages positions `n_past..n_past + n` need (before they are written).
    pub(crate) fn reserve(&mut self, n: usize) -> Result<(), RuntimeError> {
        let mut c = locked(&self.cache);
        debug_assert!(
            self.n_past.is_multiple_of(PAGE) || !c.pool.shared(self.pages[self.n_past / PAGE]),
            "a shared page would be written"
        );
        c.pool.grow(&mut self.pages, self.n_past + n)?;
        self.sink = c.pool.sink(&self.pages);
        Ok(())
    }
}

impl<B: Backend> Drop for Session<B> {
    /// Gives the session's pages and slot back to the shared cache.
    fn drop(&mut self) {
        let mut c = locked(&self.cache);
        c.pool.release(self.slot, &mut self.pages);
    }
}
