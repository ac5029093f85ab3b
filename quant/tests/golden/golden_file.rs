//! Shared by quant/tests/golden.rs and quant/tests/oracle_gguf_py.rs: the golden.bin
//! container (format in README.md), the bulk-input regeneration that mirrors
//! make_golden.py, and our quantization entry points.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::OnceLock;

use duet_quant::blocks::{BlockQ8_1, BlockQ8K};
use duet_quant::{GgmlType, kquants, legacy, quantize, quantize_with_imatrix, row_bytes};

pub const GOLDEN: &[u8] = include_bytes!("golden.bin");
pub const MAGIC: &[u8; 8] = b"DUETGLD1";
pub const FLAG_IMATRIX: u32 = 1;
pub const FLAG_FLOAT_ONLY: u32 = 2;
/// Values per `dq/` entry (make_golden.py's DQ_ELEMS).
pub const DQ_ELEMS: usize = 256;

pub struct Case {
    pub name: String,
    pub n_per_row: usize,
    pub nrows: usize,
    pub float_only: bool,
    pub x: Vec<f32>,
    pub imatrix: Option<Vec<f32>>,
}

/// A case regenerated from its seed (make_golden.py's BULK).
pub struct BulkCase {
    pub name: String,
    pub n_per_row: usize,
    pub float_only: bool,
    pub x: Vec<f32>,
    pub imatrix: Option<Vec<f32>>,
}

pub struct Golden {
    pub entries: BTreeMap<String, Vec<u8>>,
    pub cases: Vec<Case>,
    pub bulk: Vec<BulkCase>,
}

/// splitmix64 and the exact float64 arithmetic of make_golden.py's Rng.
pub struct Rng(pub u64);

impl Rng {
    pub fn u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1), a multiple of 2^-40.
    pub fn uniform(&mut self) -> f64 {
        (self.u64() >> 24) as f64 / (1u64 << 40) as f64
    }
    /// Irwin–Hall: the sum of 12 uniforms minus 6 (exact in f64).
    pub fn normal(&mut self) -> f64 {
        let mut s = 0.0f64;
        for _ in 0..12 {
            s += self.uniform();
        }
        s - 6.0
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.u64() % n
    }
}

/// FNV-1a over little-endian u32 words (zero-padded), then the byte length (make_golden.py's fnv64).
pub fn fnv64(b: &[u8]) -> u64 {
    const PRIME: u64 = 0x100_0000_01B3;
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for c in b.chunks(4) {
        let mut w = [0u8; 4];
        w[..c.len()].copy_from_slice(c);
        h = (h ^ u32::from_le_bytes(w) as u64).wrapping_mul(PRIME);
    }
    (h ^ b.len() as u64).wrapping_mul(PRIME)
}

pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|f| f.to_le_bytes()).collect()
}

pub const KIND_NORMAL: u32 = 1;
pub const KIND_HEAVY: u32 = 2;
pub const KIND_BITS: u32 = 3;
pub const BULK_SCALES: [f64; 5] = [1.0, 0.02, 37.5, 1e-3, 300.0];

/// make_golden.py's bulk_inputs, step for step.
pub fn bulk_inputs(seed: u64, kind: u32, n: usize, nrows: usize, with_imatrix: bool) -> (Vec<f32>, Option<Vec<f32>>) {
    let mut rng = Rng(seed);
    let x: Vec<f32> = if kind == KIND_BITS {
        (0..n * nrows).map(|_| f32::from_bits(rng.u64() as u32)).collect()
    } else {
        let mut v = Vec::with_capacity(n * nrows);
        for r in 0..nrows {
            let sc = BULK_SCALES[r % BULK_SCALES.len()];
            for _ in 0..n {
                let g = rng.normal();
                v.push(match kind {
                    KIND_NORMAL => g * sc,
                    KIND_HEAVY => 0.3 * g * g * g * sc,
                    _ => panic!("unknown bulk kind {kind}"),
                } as f32);
            }
        }
        v
    };
    let imatrix = with_imatrix.then(|| {
        (0..n)
            .map(|_| {
                if rng.uniform() < 0.1 {
                    0.0
                } else {
                    let u = rng.uniform();
                    (0.05 + 20.0 * u * u * u) as f32
                }
            })
            .collect()
    });
    (x, imatrix)
}

pub fn finite_f16(rng: &mut Rng) -> [u8; 2] {
    let mut h = (rng.u64() & 0xFFFF) as u16;
    if h & 0x7C00 == 0x7C00 {
        h &= !0x4000;
    }
    h.to_le_bytes()
}

/// make_golden.py's random_blocks: one u64 per byte, then finite random scale fields.
pub fn random_blocks(rng: &mut Rng, ty: GgmlType, n_blocks: usize) -> Vec<u8> {
    let tsize = ty.type_size();
    let mut out = Vec::with_capacity(n_blocks * tsize);
    for _ in 0..n_blocks {
        let mut blk: Vec<u8> = (0..tsize).map(|_| rng.u64() as u8).collect();
        match ty {
            GgmlType::Q8_K => {
                let e = 127 - 30 + rng.below(60);
                let sign = rng.below(2);
                let mant = rng.u64() & 0x7F_FFFF;
                blk[0..4].copy_from_slice(&(((sign << 31) | (e << 23) | mant) as u32).to_le_bytes());
            }
            GgmlType::Q6_K => blk[208..210].copy_from_slice(&finite_f16(rng)),
            _ => {
                blk[0..2].copy_from_slice(&finite_f16(rng));
                if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K) {
                    blk[2..4].copy_from_slice(&finite_f16(rng));
                }
            }
        }
        out.extend_from_slice(&blk);
    }
    out
}

pub fn le_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().unwrap())
}
pub fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
pub fn f32s(b: &[u8]) -> Vec<f32> {
    assert_eq!(b.len() % 4, 0);
    b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

/// Parses the container (format in golden/README.md): magic, u32 count, then per entry
/// u16 key length, ASCII key, u32 value length, value.
pub fn golden() -> &'static Golden {
    static G: OnceLock<Golden> = OnceLock::new();
    G.get_or_init(|| {
        let b = GOLDEN;
        assert_eq!(&b[..8], MAGIC, "golden.bin: bad magic");
        let count = le_u32(b, 8) as usize;
        let mut at = 12;
        let mut entries = BTreeMap::new();
        let mut case_order = Vec::new();
        for _ in 0..count {
            let klen = le_u16(b, at) as usize;
            let key = std::str::from_utf8(&b[at + 2..at + 2 + klen]).expect("ASCII key").to_string();
            at += 2 + klen;
            let vlen = le_u32(b, at) as usize;
            at += 4;
            let val = b[at..at + vlen].to_vec();
            at += vlen;
            if key.starts_with("case/") {
                case_order.push(key.clone());
            }
            assert!(entries.insert(key.clone(), val).is_none(), "duplicate key {key}");
        }
        assert_eq!(at, b.len(), "golden.bin: trailing bytes");
        let cases = case_order
            .iter()
            .map(|key| {
                let v = &entries[key];
                let (n_per_row, nrows, flags) = (le_u32(v, 0) as usize, le_u32(v, 4) as usize, le_u32(v, 8));
                let n = n_per_row * nrows;
                let x = f32s(&v[12..12 + 4 * n]);
                let imatrix = (flags & FLAG_IMATRIX != 0).then(|| f32s(&v[12 + 4 * n..]));
                let expect_len = 12 + 4 * n + if imatrix.is_some() { 4 * n_per_row } else { 0 };
                assert_eq!(v.len(), expect_len, "{key}: wrong length");
                Case {
                    name: key["case/".len()..].to_string(),
                    n_per_row,
                    nrows,
                    float_only: flags & FLAG_FLOAT_ONLY != 0,
                    x,
                    imatrix,
                }
            })
            .collect();
        let bulk = entries
            .iter()
            .filter(|(k, _)| k.starts_with("bulk/"))
            .map(|(key, v)| {
                let u32_at = |i: usize| le_u32(v, i);
                let u64_at = |i: usize| u64::from_le_bytes(v[i..i + 8].try_into().unwrap());
                assert_eq!(v.len(), 40, "{key}");
                let (n, nrows, flags, kind) = (u32_at(0) as usize, u32_at(4) as usize, u32_at(8), u32_at(12));
                let (seed, x_hash, im_hash) = (u64_at(16), u64_at(24), u64_at(32));
                let (x, imatrix) = bulk_inputs(seed, kind, n, nrows, flags & FLAG_IMATRIX != 0);
                // The regenerated inputs must be the ones ggml saw.
                assert_eq!(fnv64(&f32_bytes(&x)), x_hash, "{key}: regenerated inputs differ from make_golden.py's");
                if let Some(w) = &imatrix {
                    assert_eq!(fnv64(&f32_bytes(w)), im_hash, "{key}: regenerated imatrix differs");
                }
                BulkCase {
                    name: key["bulk/".len()..].to_string(),
                    n_per_row: n,
                    float_only: flags & FLAG_FLOAT_ONLY != 0,
                    x,
                    imatrix,
                }
            })
            .collect();
        Golden { entries, cases, bulk }
    })
}

/// Our bytes for `x`, through the same entry points a user of the crate calls.
pub fn ours(ty: GgmlType, x: &[f32], n_per_row: usize, imatrix: Option<&[f32]>) -> Vec<u8> {
    match ty {
        // The activation formats have no row-level API (they are never written to files).
        GgmlType::Q8_1 => {
            let mut b = vec![BlockQ8_1::default(); x.len() / 32];
            legacy::quantize_row_q8_1(x, &mut b);
            bytemuck::cast_slice(&b).to_vec()
        }
        GgmlType::Q8_K => {
            let mut b = vec![BlockQ8K::default(); x.len() / 256];
            kquants::quantize_row_q8_k(x, &mut b);
            bytemuck::cast_slice(&b).to_vec()
        }
        _ => {
            let mut out = vec![0u8; row_bytes(ty, x.len()).expect("whole blocks")];
            match imatrix {
                Some(w) => quantize_with_imatrix(ty, x, n_per_row, w, &mut out),
                None => quantize(ty, x, n_per_row, &mut out),
            }
            .unwrap_or_else(|e| panic!("{ty}: {e}"));
            out
        }
    }
}

pub fn hex(b: &[u8]) -> String {
    b.iter().fold(String::with_capacity(2 * b.len()), |mut s, v| {
        let _ = write!(s, "{v:02x}");
        s
    })
}
