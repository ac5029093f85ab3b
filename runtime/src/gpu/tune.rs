//! The kernel choices a run can make (`--gpu-tune`): the matvec's workgroup shape,
//! subgroup reductions, trusted shader modules and fusion. Each defaults to what suits the
//! adapter; naming one that the adapter cannot run is refused with the reason when the
//! device is opened ([`super::device::GpuContext::new`]), never left to fail in a kernel.
//! One GPU run sweeps them (`runtime/bench/gpu_speed.sh`), so that the defaults follow
//! measurements.

use duet_shaders::MvShape;

/// Kernel choices; `None` leaves one to the adapter's default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuTune {
    /// Matvec threads per workgroup and weight rows per workgroup.
    pub matvec: Option<(u32, u32)>,
    /// Subgroup reductions in the matvec (default: where the adapter has SUBGROUP).
    pub subgroups: Option<bool>,
    /// Shader modules without naga's bounds checks and loop bounding for the kernels whose
    /// accesses are in range by construction ([`duet_shaders::Op::trusted`]); default on
    /// hardware adapters.
    pub trusted: Option<bool>,
    /// Fused kernels: matvec epilogues (residual add, SwiGLU, the q/k/v split) and RoPE with
    /// the K/V write; off runs one dispatch per op (default on).
    pub fuse: Option<bool>,
    /// Workgroups a decoded row's attention is spread over, the keys split into chunks of
    /// whole 64-key tiles until the heads × chunks reach it (default 4,096).
    pub attn_workgroups: Option<usize>,
    /// Tokens up to which a matrix product runs the matvec once per token rather than the
    /// tiled matmul (several sequences' decode steps; default 8).
    pub matvec_tokens: Option<usize>,
    /// Those tokens' workgroups interleaved (the tokens of a row group side by side, so
    /// that the weights are read from memory once), else one token per dispatch z
    /// (default off: not yet measured on a GPU).
    pub matvec_interleave: Option<bool>,
    /// The prefill product on cooperative matrices (tensor cores; default on where the
    /// adapter has them, [`super::device::coop_lacks`]).
    pub coop: Option<bool>,
    /// Tokens per tile of that product: 64 or 128 (default 128).
    pub coop_tokens: Option<u32>,
}

impl GpuTune {
    /// What `--gpu-tune` accepts, for `--help` and error messages.
    pub const HELP: &'static str = "comma-separated KEY=VALUE: matvec=WGxROWS (threads and weight rows per \
        workgroup of the decode matvec: WG 32, 64, 128 or 256, ROWS 1, 2 or 4; default 128x2 on a GPU, 32x4 on a \
        software adapter), subgroups=on|off (subgroup reductions; default on where the adapter has them), \
        trusted=on|off (kernels proven in bounds skip the shader compiler's runtime checks; default on a GPU, off on a software adapter), \
        fuse=on|off (fused kernels: matvec epilogues, RoPE with the K/V write; default on), \
        attn=N (workgroups a decoded token's attention is split over, 1 to 65536; default 4096), \
        mvtok=N (products of up to N tokens, as several sequences' decode steps, run the matvec once per token \
        instead of the tiled matmul: 1 to 64; default 8), \
        mvinterleave=on|off (those tokens' workgroups of the same rows side by side, so the weights are read \
        from memory once for all of them; off: one token per dispatch z, the default until measured on a GPU), \
        coop=on|off (the prefill product on cooperative matrices, i.e. tensor cores: f16 products, f32 sums; default on \
        where the adapter has 16x16x16 f16 matrices and subgroups of 32), \
        cooptile=64|128 (tokens per workgroup tile of that product; default 128)";

    /// Parses `--gpu-tune`'s value (empty: all defaults).
    pub fn parse(s: &str) -> Result<GpuTune, String> {
        let mut t = GpuTune::default();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (key, value) =
                item.split_once('=').ok_or_else(|| format!("'{item}' is not KEY=VALUE ({})", GpuTune::HELP))?;
            let on_off = || match value.trim() {
                "on" | "1" | "true" => Ok(true),
                "off" | "0" | "false" => Ok(false),
                v => Err(format!("{key}={v}: the value must be on or off")),
            };
            match key.trim() {
                "matvec" => {
                    let shape = MvShape::parse(value, false)?;
                    t.matvec = Some((shape.wg, shape.rows));
                }
                "subgroups" => t.subgroups = Some(on_off()?),
                "trusted" => t.trusted = Some(on_off()?),
                "fuse" => t.fuse = Some(on_off()?),
                "coop" => t.coop = Some(on_off()?),
                "mvinterleave" => t.matvec_interleave = Some(on_off()?),
                "cooptile" => {
                    t.coop_tokens = match value.trim() {
                        "64" => Some(64),
                        "128" => Some(128),
                        v => return Err(format!("cooptile={v}: must be 64 or 128")),
                    }
                }
                "attn" => {
                    let n: usize = value.trim().parse().map_err(|_| format!("attn={value}: not a number"))?;
                    if !(1..=65536).contains(&n) {
                        return Err(format!("attn={n}: must be 1 to 65536"));
                    }
                    t.attn_workgroups = Some(n);
                }
                "mvtok" => {
                    let n: usize = value.trim().parse().map_err(|_| format!("mvtok={value}: not a number"))?;
                    if !(1..=64).contains(&n) {
                        return Err(format!("mvtok={n}: must be 1 to 64"));
                    }
                    t.matvec_tokens = Some(n);
                }
                k => return Err(format!("unknown --gpu-tune key '{k}' ({})", GpuTune::HELP)),
            }
        }
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_key_and_refuses_what_it_does_not_know() {
        let t = GpuTune::parse(
            "matvec=64x4, subgroups=off,trusted=on,fuse=0,attn=512,mvtok=4,coop=off,cooptile=128,mvinterleave=off",
        )
        .unwrap();
        assert_eq!(
            t,
            GpuTune {
                matvec: Some((64, 4)),
                subgroups: Some(false),
                trusted: Some(true),
                fuse: Some(false),
                attn_workgroups: Some(512),
                matvec_tokens: Some(4),
                matvec_interleave: Some(false),
                coop: Some(false),
                coop_tokens: Some(128),
            }
        );
        assert_eq!(GpuTune::parse("").unwrap(), GpuTune::default());
        for bad in [
            "matvec=100x2",
            "matvec=128x3",
            "matvec=128",
            "subgroups=maybe",
            "speed=max",
            "fuse",
            "attn=0",
            "attn=x",
            "mvtok=0",
            "mvtok=65",
            "coop=fast",
            "mvinterleave=2",
            "cooptile=32",
        ] {
            assert!(GpuTune::parse(bad).is_err(), "{bad} accepted");
        }
        assert!(GpuTune::parse("colour=red").unwrap_err().contains("unknown --gpu-tune key 'colour'"));
    }
}
