//! Portable [`Arch`]: plain arrays of 16 lanes. A reference for the packed layout on every
//! target (tests run it under qemu for aarch64 too); not used for speed (`fast: false`).

use super::kernels::{Arch, kernel_set};

#[derive(Clone, Copy)]
pub(super) struct Portable;

type V = [u32; 16];
type F = [f32; 16];

#[inline(always)]
fn map(a: V, f: impl Fn(u32) -> u32) -> V {
    a.map(f)
}

#[inline(always)]
fn zip(a: V, b: V, f: impl Fn(u32, u32) -> u32) -> V {
    std::array::from_fn(|i| f(a[i], b[i]))
}

#[inline(always)]
fn zipf(a: F, b: F, f: impl Fn(f32, f32) -> f32) -> F {
    std::array::from_fn(|i| f(a[i], b[i]))
}

/// Reads `N` bytes at `p`.
///
/// # Safety
/// `p` must be valid for N bytes.
#[inline(always)]
unsafe fn rd<const N: usize>(p: *const u8) -> [u8; N] {
    // SAFETY: forwarded.
    unsafe { (p as *const [u8; N]).read_unaligned() }
}

// SAFETY (all methods): pointers are valid for the bytes read, by the trait's contract.
impl Arch for Portable {
    const LANES: usize = 16;
    const NMAX: usize = 4;
    const CHAINS: usize = 1;
    const CHAINS_K: usize = 1;
    const Q8_BIASED: bool = true;
    type V = V;
    type F = F;
    type W8 = V;

    unsafe fn zero() -> V {
        [0; 16]
    }
    unsafe fn splat8(x: u8) -> V {
        [u32::from_ne_bytes([x; 4]); 16]
    }
    unsafe fn splat32(x: u32) -> V {
        [x; 16]
    }
    unsafe fn load(p: *const u8) -> V {
        let b: [u8; 64] = unsafe { rd(p) };
        std::array::from_fn(|i| u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]))
    }
    unsafe fn and(a: V, b: V) -> V {
        zip(a, b, |x, y| x & y)
    }
    unsafe fn or(a: V, b: V) -> V {
        zip(a, b, |x, y| x | y)
    }
    unsafe fn srli16<const S: u32>(a: V) -> V {
        map(a, |x| {
            let (lo, hi) = (x & 0xffff, x >> 16);
            ((lo >> S) & 0xffff) | (((hi >> S) & 0xffff) << 16)
        })
    }
    unsafe fn srli32<const S: u32>(a: V) -> V {
        map(a, |x| x >> S)
    }
    unsafe fn slli32<const S: u32>(a: V) -> V {
        map(a, |x| x << S)
    }
    unsafe fn add32(a: V, b: V) -> V {
        zip(a, b, |x, y| x.wrapping_add(y))
    }
    unsafe fn byte_lane(a: V, j: u32) -> V {
        map(a, |x| (x >> (8 * j)) & 0xff)
    }
    unsafe fn byte_lane_x2(a: V, j: u32) -> V {
        map(a, |x| ((x >> (8 * j)) & 0xff) * 0x1_0001)
    }
    unsafe fn bcast_i32(p: *const u8) -> V {
        [u32::from_le_bytes(unsafe { rd(p) }); 16]
    }
    unsafe fn dot(acc: V, w: V, a: *const u8) -> V {
        let a: [u8; 4] = unsafe { rd(a) };
        map_idx(acc, w, |acc, w| {
            let wb = w.to_le_bytes();
            let s: i32 = (0..4).map(|j| wb[j] as i32 * a[j] as i8 as i32).sum();
            (acc as i32).wrapping_add(s) as u32
        })
    }
    unsafe fn prep_q8(w: V) -> V {
        w
    }
    unsafe fn dot_q8(acc: V, w: V, a: *const u8) -> V {
        unsafe { Self::dot(acc, w, a) }
    }
    unsafe fn dot16(acc: V, w: V, a: *const u8) -> V {
        let a: [u8; 4] = unsafe { rd(a) };
        let (a0, a1) = (i16::from_le_bytes([a[0], a[1]]) as i32, i16::from_le_bytes([a[2], a[3]]) as i32);
        map_idx(acc, w, |acc, w| {
            let (w0, w1) = (w as u16 as i16 as i32, (w >> 16) as u16 as i16 as i32);
            (acc as i32).wrapping_add(w0 * a0 + w1 * a1) as u32
        })
    }
    unsafe fn madd16(acc: V, a: V, b: V) -> V {
        let i16s = |x: u32| (x as u16 as i16 as i32, (x >> 16) as u16 as i16 as i32);
        std::array::from_fn(|i| {
            let ((a0, a1), (b0, b1)) = (i16s(a[i]), i16s(b[i]));
            // Wrapping like vpmaddwd (whose only overflow, two (−2¹⁵)² products, wraps).
            (acc[i] as i32).wrapping_add((a0 * b0).wrapping_add(a1 * b1)) as u32
        })
    }
    unsafe fn sub16(a: V, b: V) -> V {
        zip(a, b, |x, y| halves(x, y, i16::wrapping_sub))
    }
    unsafe fn set_bit4(w: V, bits: *const u8) -> V {
        let m = u64::from_le_bytes(unsafe { rd(bits) });
        std::array::from_fn(|i| {
            let mut b = w[i].to_le_bytes();
            for (j, byte) in b.iter_mut().enumerate() {
                if (m >> (4 * i + j)) & 1 != 0 {
                    *byte += 16;
                }
            }
            u32::from_le_bytes(b)
        })
    }
    unsafe fn zero_f() -> F {
        [0.0; 16]
    }
    unsafe fn cvt(a: V) -> F {
        a.map(|x| x as i32 as f32)
    }
    unsafe fn fmadd(a: F, b: F, c: F) -> F {
        std::array::from_fn(|i| a[i].mul_add(b[i], c[i]))
    }
    unsafe fn fnmadd(a: F, b: F, c: F) -> F {
        std::array::from_fn(|i| (-a[i]).mul_add(b[i], c[i]))
    }
    unsafe fn mul(a: F, b: F) -> F {
        zipf(a, b, |x, y| x * y)
    }
    unsafe fn add_f(a: F, b: F) -> F {
        zipf(a, b, |x, y| x + y)
    }
    unsafe fn bcast_f32(p: *const u8) -> F {
        [f32::from_le_bytes(unsafe { rd(p) }); 16]
    }
    unsafe fn load_f16(p: *const u8) -> F {
        let b: [u8; 32] = unsafe { rd(p) };
        std::array::from_fn(|i| crate::fp::f16_bits_to_f32(u16::from_le_bytes([b[2 * i], b[2 * i + 1]])))
    }
    unsafe fn load_bf16(p: *const u8) -> F {
        let b: [u8; 32] = unsafe { rd(p) };
        std::array::from_fn(|i| crate::fp::bf16_bits_to_f32(u16::from_le_bytes([b[2 * i], b[2 * i + 1]])))
    }
    unsafe fn load_i8f(p: *const u8) -> F {
        let b: [u8; 16] = unsafe { rd(p) };
        b.map(|x| x as i8 as f32)
    }
    unsafe fn store(a: F, p: *mut f32) {
        unsafe { (p as *mut [f32; 16]).write_unaligned(a) }
    }
}

/// `f` on the two 16-bit halves of x and y.
#[inline(always)]
fn halves(x: u32, y: u32, f: impl Fn(i16, i16) -> i16) -> u32 {
    let lo = f(x as u16 as i16, y as u16 as i16) as u16 as u32;
    let hi = f((x >> 16) as u16 as i16, (y >> 16) as u16 as i16) as u16 as u32;
    lo | hi << 16
}

#[inline(always)]
fn map_idx(acc: V, w: V, f: impl Fn(u32, u32) -> u32) -> V {
    std::array::from_fn(|i| f(acc[i], w[i]))
}

kernel_set!(pub(super) portable_set, "portable", Portable, false, []);
pub(super) use portable_set::KERNELS;
