//! Sliding-window operators: convolution, transposed convolution and pooling.

use super::{ck, dim, dtype, missing, rank_at_least, Attrs, Ctx, Info, Result, ShapeError};
use crate::onnx::proto::Node;

/// Output extent of a sliding window (convolution or pooling) along one axis.
fn window(
    input: u64,
    kernel: u64,
    stride: u64,
    dilation: u64,
    pad_begin: u64,
    pad_end: u64,
    ceil: bool,
) -> Result<u64> {
    let extent = ck(dilation.checked_mul(kernel.saturating_sub(1)))?.saturating_add(1);
    let padded = ck(input
        .checked_add(pad_begin)
        .and_then(|v| v.checked_add(pad_end)))?;
    if stride == 0 || kernel == 0 || padded < extent {
        return Err(ShapeError::Window {
            window: extent,
            input: padded,
        });
    }
    let span = padded - extent;
    let mut out = if ceil {
        span.div_ceil(stride) + 1
    } else {
        span / stride + 1
    };
    // The last window must start inside the input or its begin padding (ONNX and PyTorch).
    if ceil && (out - 1).saturating_mul(stride) >= input.saturating_add(pad_begin) {
        out -= 1;
    }
    Ok(out)
}

/// An attribute list of `len` non-negative values, `default` each when absent.
fn list(at: &Attrs<'_>, name: &'static str, len: usize, default: u64) -> Result<Vec<u64>> {
    match at.ints(name) {
        None => Ok(vec![default; len]),
        Some(v) if v.len() == len => v
            .iter()
            .map(|&d| {
                u64::try_from(d).map_err(|_| ShapeError::Attribute {
                    name,
                    problem: "has a negative value",
                })
            })
            .collect(),
        Some(_) => Err(ShapeError::Attribute {
            name,
            problem: "has the wrong number of values",
        }),
    }
}

/// Spatial output shape of `Conv` and the pooling operators; `x` is `[N, C, spatial...]`.
fn windowed(node: &Node, x: &[u64], kernel: &[u64], channels: u64, pool: bool) -> Result<Vec<u64>> {
    let at = Attrs(node);
    let n = x.len() - 2;
    if kernel.len() != n {
        return Err(ShapeError::Attribute {
            name: "kernel_shape",
            problem: "does not match the input's spatial rank",
        });
    }
    let strides = list(&at, "strides", n, 1)?;
    let dilations = list(&at, "dilations", n, 1)?;
    let pads = list(&at, "pads", 2 * n, 0)?;
    let ceil = pool && at.int_or("ceil_mode", 0) != 0;
    let auto_pad = at.string("auto_pad").unwrap_or(b"NOTSET");
    let mut out = vec![x[0], channels];
    for i in 0..n {
        let o = match auto_pad {
            b"SAME_UPPER" | b"SAME_LOWER" => {
                if strides[i] == 0 {
                    return Err(ShapeError::Window {
                        window: kernel[i],
                        input: x[i + 2],
                    });
                }
                x[i + 2].div_ceil(strides[i])
            }
            b"VALID" => window(x[i + 2], kernel[i], strides[i], dilations[i], 0, 0, ceil)?,
            b"NOTSET" | b"" => window(
                x[i + 2],
                kernel[i],
                strides[i],
                dilations[i],
                pads[i],
                pads[i + n],
                ceil,
            )?,
            _ => {
                return Err(ShapeError::Attribute {
                    name: "auto_pad",
                    problem: "is not NOTSET, VALID, SAME_UPPER or SAME_LOWER",
                })
            }
        };
        out.push(o);
    }
    Ok(out)
}

/// `Conv`: `[N, C, spatial...]` with weights `[M, C/group, kernel...]` to `[N, M, spatial'...]`.
pub(super) fn conv(c: &Ctx<'_, '_>) -> Result<Vec<Info>> {
    let node = c.node;
    let at = &c.at;
    let ins = &c.ins;
    let x = ins.get(0)?;
    let w = ins.get(1)?;
    rank_at_least(x, 0, 3, "at least 3 ([N, C, spatial...])")?;
    if w.shape.len() != x.shape.len() {
        return Err(ShapeError::Rank {
            index: 1,
            rank: w.shape.len(),
            expected: "the input's rank ([M, C/group, kernel...])",
        });
    }
    let group = u64::try_from(at.int_or("group", 1)).unwrap_or(0);
    let channels = ck(w.shape[1].checked_mul(group))?;
    if group == 0 || channels != x.shape[1] {
        return Err(ShapeError::Mismatch {
            what: "input channels vs weight channels × group",
            left: x.shape[1],
            right: channels,
        });
    }
    let kernel = match at.ints("kernel_shape") {
        Some(k) => k.iter().map(|&d| dim(d)).collect::<Result<Vec<_>>>()?,
        None => w.shape[2..].to_vec(),
    };
    Ok(vec![Info::new(
        x.dtype,
        windowed(node, &x.shape, &kernel, w.shape[0], false)?,
    )])
}

/// `MaxPool`, `AveragePool` and `LpPool` (with `ceil_mode`); output 1 is `MaxPool`'s indices.
pub(super) fn pool(c: &Ctx<'_, '_>) -> Result<Vec<Info>> {
    let node = c.node;
    let at = &c.at;
    let ins = &c.ins;
    let x = ins.get(0)?;
    rank_at_least(x, 0, 3, "at least 3 ([N, C, spatial...])")?;
    let kernel = at
        .ints("kernel_shape")
        .ok_or_else(|| missing("kernel_shape"))?
        .iter()
        .map(|&d| dim(d))
        .collect::<Result<Vec<_>>>()?;
    let shape = windowed(node, &x.shape, &kernel, x.shape[1], true)?;
    Ok(vec![
        Info::new(x.dtype, shape.clone()),
        Info::new(dtype::INT64, shape),
    ])
}

/// `GlobalAveragePool`, `GlobalMaxPool` and `GlobalLpPool`: every spatial dimension becomes 1.
pub(super) fn global_pool(c: &Ctx<'_, '_>) -> Result<Vec<Info>> {
    let ins = &c.ins;
    let x = ins.get(0)?;
    rank_at_least(x, 0, 2, "at least 2 ([N, C, ...])")?;
    let mut s = x.shape.clone();
    s[2..].iter_mut().for_each(|d| *d = 1);
    Ok(vec![Info::new(x.dtype, s)])
}

/// `ConvTranspose`: `[N, C, spatial...]` with weights `[C, M/group, kernel...]` to `[N, M, ...]`,
/// each spatial extent `stride × (in - 1) + output_padding + dilated kernel - pads`, or
/// `output_shape` when given.
pub(super) fn conv_transpose(c: &Ctx<'_, '_>) -> Result<Vec<Info>> {
    let (at, ins) = (&c.at, &c.ins);
    let x = ins.get(0)?;
    let w = ins.get(1)?;
    rank_at_least(x, 0, 3, "at least 3 ([N, C, spatial...])")?;
    if w.shape.len() != x.shape.len() {
        return Err(ShapeError::Rank {
            index: 1,
            rank: w.shape.len(),
            expected: "the input's rank ([C, M/group, kernel...])",
        });
    }
    let group = u64::try_from(at.int_or("group", 1)).unwrap_or(0);
    if group == 0 || w.shape[0] != x.shape[1] {
        return Err(ShapeError::Mismatch {
            what: "input channels vs the weight's first dimension",
            left: x.shape[1],
            right: w.shape[0],
        });
    }
    let n = x.shape.len() - 2;
    let kernel = match at.ints("kernel_shape") {
        Some(k) => k.iter().map(|&d| dim(d)).collect::<Result<Vec<_>>>()?,
        None => w.shape[2..].to_vec(),
    };
    if kernel.len() != n {
        return Err(ShapeError::Attribute {
            name: "kernel_shape",
            problem: "does not match the input's spatial rank",
        });
    }
    let mut out = vec![x.shape[0], ck(w.shape[1].checked_mul(group))?];
    if let Some(shape) = at.ints("output_shape") {
        let spatial = shape.get(shape.len().saturating_sub(n)..).unwrap_or(&[]);
        if spatial.len() != n {
            return Err(ShapeError::Attribute {
                name: "output_shape",
                problem: "does not match the input's spatial rank",
            });
        }
        for &d in spatial {
            out.push(dim(d)?);
        }
        return Ok(vec![Info::new(x.dtype, out)]);
    }
    let strides = list(at, "strides", n, 1)?;
    let dilations = list(at, "dilations", n, 1)?;
    let pads = list(at, "pads", 2 * n, 0)?;
    let extra = list(at, "output_padding", n, 0)?;
    let same = matches!(at.string("auto_pad"), Some(b"SAME_UPPER" | b"SAME_LOWER"));
    for i in 0..n {
        let input = x.shape[i + 2];
        let o = if same {
            ck(input.checked_mul(strides[i]))?
        } else {
            let extent = ck(dilations[i].checked_mul(kernel[i].saturating_sub(1)))?;
            let full = ck(input
                .saturating_sub(1)
                .checked_mul(strides[i])
                .and_then(|v| v.checked_add(extra[i]))
                .and_then(|v| v.checked_add(extent))
                .and_then(|v| v.checked_add(1)))?;
            full.checked_sub(pads[i])
                .and_then(|v| v.checked_sub(pads[i + n]))
                .filter(|&v| v > 0)
                .ok_or(ShapeError::Window {
                    window: full,
                    input,
                })?
        };
        out.push(o);
    }
    Ok(vec![Info::new(x.dtype, out)])
}
