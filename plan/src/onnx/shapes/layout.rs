//! Operators that move, split, join or reinterpret data, and shape computations whose values
//! fold to constants.

use super::{axis, ck, dim, missing, Ctx, Info, Result, ShapeError, MAX_VALUES};

/// `Flatten`: `[outer, inner]` split at `axis`.
pub(super) fn flatten(c: &Ctx<'_, '_>) -> Result<Vec<Info>> {
    let at = &c.at;
    let ins = &c.ins;
    let x = ins.get(0)?;
    let r = x.shape.len();
    let a = at.int_or("axis", 1);
    let a = if a == i64::try_from(r).unwrap_or(i64::MAX) {
        r
    } else {
        axis(a, r)?
    };
    let outer = x.shape[..a].iter().try_fold(1u64, |n, &d| n.checked_mul(d));
    let inner = x.shape[a..].iter().try_fold(1u64, |n, &d| n.checked_mul(d));
    Ok(vec![Info::new(x.dtype, vec![ck(outer)?, ck(inner)?])])
}

/// `Reshape`: the target from a constant input (opset 5 on) or the `shape` attribute.
pub(super) fn reshape_op(c: &Ctx<'_, '_>) -> Result<Vec<Info>> {
    let opset = c.opset;
    let at = &c.at;
    let ins = &c.ins;
    let x = ins.get(0)?;
    let target: Vec<i64> = if opset < 5 {
        at.ints("shape").ok_or_else(|| missing("shape"))?.to_vec()
    } else {
        ins.value(1)?.to_vec()
    };
    let mut o = Info::new(
        x.dtype,
        reshape(&x.shape, &target, at.int_or("allowzero", 0) != 0)?,
    );
    o.value.clone_from(&x.value);
    Ok(vec![o])
}

/// `Transpose`: `perm`, or the axes reversed.
pub(super) fn transpose(c: &Ctx<'_, '_>) -> Result<Vec<Info>> {
    let at = &c.at;
    let ins = &c.ins;
    let x = ins.get(0)?;
    let r = x.shape.len();
    let perm: Vec<usize> = match at.ints("perm") {
        None => (0..r).rev().collect(),
        Some(p) => p.iter().map(|&a| axis(a, r)).collect::<Result<_>>()?,
    };
    let mut seen = vec![false; r];
    if perm.len() != r || perm.iter().any(|&a| std::mem::replace(&mut seen[a], true)) {
        return Err(ShapeError::Attribute {
            name: "perm",
            problem: "is not a permutation of the input's axes",
        });
    }
    Ok(vec![Info::new(
        x.dtype,
        perm.iter().map(|&a| x.shape[a]).collect(),
    )])
}

/// `Concat`; 1-D constants concatenated keep their values (up to `MAX_VALUES`).
pub(super) fn concat(c: &Ctx<'_, '_>) -> Result<Vec<Info>> {
    let at = &c.at;
    let ins = &c.ins;
    let first = ins.get(0)?;
    let a = axis(
        at.int("axis").ok_or_else(|| missing("axis"))?,
        first.shape.len(),
    )?;
    let mut shape = first.shape.clone();
    let mut value = Some(Vec::new());
    for index in 0..c.n_inputs {
        let t = ins.get(index)?;
        if t.shape.len() != shape.len() {
            return Err(ShapeError::Rank {
                index,
                rank: t.shape.len(),
                expected: "that of input 0",
            });
        }
        for (i, (&d, &e)) in t.shape.iter().zip(&first.shape).enumerate() {
            if i != a && d != e {
                return Err(ShapeError::Mismatch {
                    what: "Concat dimensions off the axis",
                    left: e,
                    right: d,
                });
            }
        }
        if index > 0 {
            shape[a] = ck(shape[a].checked_add(t.shape[a]))?;
        }
        value = match (value, &t.value) {
            // Bounded, so that a chain of Concats cannot grow a value exponentially.
            (Some(mut v), Some(tv)) if shape.len() == 1 && v.len() + tv.len() <= MAX_VALUES => {
                v.extend_from_slice(tv);
                Some(v)
            }
            _ => None,
        };
    }
    Ok(vec![Info {
        dtype: first.dtype,
        shape,
        value,
        floats: None,
    }])
}

/// `Split`: sizes from the `split` attribute (before opset 13) or input, else equal parts.
pub(super) fn split(c: &Ctx<'_, '_>) -> Result<Vec<Info>> {
    let opset = c.opset;
    let at = &c.at;
    let ins = &c.ins;
    let outputs = c.outputs;
    let x = ins.get(0)?;
    let a = axis(at.int_or("axis", 0), x.shape.len())?;
    let total = x.shape[a];
    let sizes: Vec<u64> = match (opset < 13, at.ints("split"), ins.opt_value(1)?) {
        (true, Some(s), _) | (false, _, Some(s)) if !s.is_empty() => {
            s.iter().map(|&d| dim(d)).collect::<Result<_>>()?
        }
        _ => {
            let n =
                u64::try_from(at.int_or("num_outputs", i64::try_from(outputs).unwrap_or(i64::MAX)))
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or(ShapeError::Attribute {
                        name: "num_outputs",
                        problem: "must be positive",
                    })?;
            if n > u64::try_from(outputs).unwrap_or(u64::MAX) {
                return Err(ShapeError::Attribute {
                    name: "num_outputs",
                    problem: "is more than the node's outputs",
                });
            }
            let chunk = total.div_ceil(n);
            if !at.has("num_outputs") && chunk.checked_mul(n) != Some(total) {
                return Err(ShapeError::Mismatch {
                    what: "Split into equal parts: dimension vs parts",
                    left: total,
                    right: n,
                });
            }
            (0..n)
                .map(|i| chunk.min(total.saturating_sub(i.saturating_mul(chunk))))
                .collect()
        }
    };
    let sum = sizes.iter().try_fold(0u64, |s, &d| s.checked_add(d));
    if sum != Some(total) {
        return Err(ShapeError::Mismatch {
            what: "Split sizes' sum vs dimension",
            left: sum.unwrap_or(u64::MAX),
            right: total,
        });
    }
    Ok(sizes
        .iter()
        .map(|&d| {
            let mut s = x.shape.clone();
            s[a] = d;
            Info::new(x.dtype, s)
        })
        .collect())
}

/// `Squeeze`: axes from the attribute (before opset 13) or input, else every 1.
pub(super) fn squeeze(c: &Ctx<'_, '_>) -> Result<Vec<Info>> {
    let opset = c.opset;
    let at = &c.at;
    let ins = &c.ins;
    let x = ins.get(0)?;
    let axes: Option<Vec<i64>> = if opset < 13 {
        at.ints("axes").map(<[i64]>::to_vec)
    } else {
        ins.opt_value(1)?.map(<[i64]>::to_vec)
    };
    let r = x.shape.len();
    let drop: Vec<usize> = match axes {
        Some(a) if !a.is_empty() => a.iter().map(|&a| axis(a, r)).collect::<Result<_>>()?,
        _ => (0..r).filter(|&i| x.shape[i] == 1).collect(),
    };
    if let Some(&i) = drop.iter().find(|&&i| x.shape[i] != 1) {
        return Err(ShapeError::Mismatch {
            what: "Squeeze of a dimension that is not 1",
            left: x.shape[i],
            right: 1,
        });
    }
    let shape = (0..r)
        .filter(|i| !drop.contains(i))
        .map(|i| x.shape[i])
        .collect();
    Ok(vec![Info {
        dtype: x.dtype,
        shape,
        value: x.value.clone(),
        floats: x.floats.clone(),
    }])
}

/// `Unsqueeze`: axes from the attribute (before opset 13) or input.
pub(super) fn unsqueeze(c: &Ctx<'_, '_>) -> Result<Vec<Info>> {
    let opset = c.opset;
    let at = &c.at;
    let ins = &c.ins;
    let x = ins.get(0)?;
    let axes: Vec<i64> = if opset < 13 {
        at.ints("axes").ok_or_else(|| missing("axes"))?.to_vec()
    } else {
        ins.value(1)?.to_vec()
    };
    let r = x.shape.len() + axes.len();
    let mut ones = vec![false; r];
    for &a in &axes {
        let a = axis(a, r)?;
        if std::mem::replace(&mut ones[a], true) {
            return Err(ShapeError::Attribute {
                name: "axes",
                problem: "repeats an axis",
            });
        }
    }
    let mut rest = x.shape.iter();
    let shape = ones
        .iter()
        .map(|&one| if one { 1 } else { *rest.next().unwrap_or(&1) })
        .collect();
    Ok(vec![Info {
        dtype: x.dtype,
        shape,
        value: x.value.clone(),
        floats: x.floats.clone(),
    }])
}

/// `Reshape`'s output: `0` copies the input's dimension (unless `allowzero`), `-1` is inferred.
pub(super) fn reshape(from: &[u64], to: &[i64], allowzero: bool) -> Result<Vec<u64>> {
    let bad = || ShapeError::Reshape {
        from: from.to_vec(),
        to: to.to_vec(),
    };
    let total = ck(from.iter().try_fold(1u64, |n, &d| n.checked_mul(d)))?;
    let mut out = Vec::with_capacity(to.len());
    let mut infer = None;
    for (i, &d) in to.iter().enumerate() {
        out.push(match d {
            -1 if infer.is_none() => {
                infer = Some(i);
                1
            }
            0 if !allowzero => *from.get(i).ok_or_else(bad)?,
            d => u64::try_from(d).map_err(|_| bad())?,
        });
    }
    let known = ck(out.iter().try_fold(1u64, |n, &d| n.checked_mul(d)))?;
    match infer {
        Some(i) => {
            if known == 0 || total % known != 0 {
                return Err(bad());
            }
            out[i] = total / known;
        }
        None if known != total => return Err(bad()),
        None => {}
    }
    Ok(out)
}

/// `d` as a signed dimension.
fn to_i64(d: u64) -> Result<i64> {
    i64::try_from(d).map_err(|_| ShapeError::Overflow)
}

/// `Slice`: `starts`, `ends`, `axes`, `steps` from constant inputs (opset 10 on) or attributes,
/// clamped as the operator defines; a sliced 1-D constant keeps its values.
pub(super) fn slice(c: &Ctx<'_, '_>) -> Result<Vec<Info>> {
    let (at, ins) = (&c.at, &c.ins);
    let x = ins.get(0)?;
    let (starts, ends, axes, steps) = if c.opset < 10 {
        (
            at.ints("starts").ok_or_else(|| missing("starts"))?,
            at.ints("ends").ok_or_else(|| missing("ends"))?,
            at.ints("axes"),
            None,
        )
    } else {
        (
            ins.value(1)?,
            ins.value(2)?,
            ins.opt_value(3)?,
            ins.opt_value(4)?,
        )
    };
    let n = starts.len();
    let r = x.shape.len();
    let all: Vec<i64> = (0..i64::try_from(n).map_err(|_| ShapeError::Overflow)?).collect();
    let axes = axes.unwrap_or(&all);
    let ones = vec![1; n];
    let steps = steps.unwrap_or(&ones);
    if ends.len() != n || axes.len() != n || steps.len() != n {
        return Err(ShapeError::Attribute {
            name: "ends",
            problem: "(or axes, or steps) has a length other than starts'",
        });
    }
    let mut shape = x.shape.clone();
    let mut picked: Option<(i64, i64, u64)> = None;
    for k in 0..n {
        let a = axis(axes[k], r)?;
        let d = to_i64(shape[a])?;
        let step = steps[k];
        let wrap = |v: i64| if v < 0 { v.saturating_add(d) } else { v };
        let (s, e) = (wrap(starts[k]), wrap(ends[k]));
        let len = match step {
            0 => {
                return Err(ShapeError::Attribute {
                    name: "steps",
                    problem: "has a zero",
                })
            }
            _ if d == 0 => (0, 0),
            1.. => {
                let (s, e) = (s.clamp(0, d), e.clamp(0, d));
                (
                    s,
                    e.saturating_sub(s)
                        .max(0)
                        .unsigned_abs()
                        .div_ceil(step.unsigned_abs()),
                )
            }
            _ => {
                let (s, e) = (s.clamp(0, d - 1), e.clamp(-1, d - 1));
                (
                    s,
                    s.saturating_sub(e)
                        .max(0)
                        .unsigned_abs()
                        .div_ceil(step.unsigned_abs()),
                )
            }
        };
        shape[a] = len.1;
        if r == 1 {
            picked = Some((len.0, step, len.1));
        }
    }
    let value = match (&x.value, picked) {
        (Some(v), Some((start, step, len))) => (0..len)
            .map(|i| {
                let j = start.checked_add(step.checked_mul(i64::try_from(i).ok()?)?)?;
                v.get(usize::try_from(j).ok()?).copied()
            })
            .collect(),
        (Some(v), None) if r == 1 => Some(v.clone()),
        _ => None,
    };
    Ok(vec![Info {
        value,
        ..Info::new(x.dtype, shape)
    }])
}

/// `Pad`: `pads` (begin values, then end values; negative crops) from the attribute (before
/// opset 11) or a constant input, on every axis or on opset 18's `axes`.
pub(super) fn pad(c: &Ctx<'_, '_>) -> Result<Vec<Info>> {
    let (at, ins) = (&c.at, &c.ins);
    let x = ins.get(0)?;
    let pads: &[i64] = if c.opset < 11 {
        at.ints("pads")
            .or_else(|| at.ints("paddings"))
            .ok_or_else(|| missing("pads"))?
    } else {
        ins.value(1)?
    };
    let r = x.shape.len();
    let axes: Vec<usize> = match ins.opt_value(3)? {
        Some(a) => a.iter().map(|&a| axis(a, r)).collect::<Result<_>>()?,
        None => (0..r).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(ShapeError::Attribute {
            name: "pads",
            problem: "does not have two values per padded axis",
        });
    }
    let mut shape = x.shape.clone();
    for (k, &a) in axes.iter().enumerate() {
        let d = i128::from(shape[a]) + i128::from(pads[k]) + i128::from(pads[k + axes.len()]);
        shape[a] = u64::try_from(d).map_err(|_| ShapeError::Attribute {
            name: "pads",
            problem: "crops more than the dimension",
        })?;
    }
    Ok(vec![Info::new(x.dtype, shape)])
}

/// `Expand`: the input broadcast against a constant shape.
pub(super) fn expand(c: &Ctx<'_, '_>) -> Result<Vec<Info>> {
    let x = c.ins.get(0)?;
    let to = c
        .ins
        .value(1)?
        .iter()
        .map(|&d| dim(d))
        .collect::<Result<Vec<_>>>()?;
    Ok(vec![Info::new(x.dtype, super::broadcast(&x.shape, &to)?)])
}

/// `Tile`: each dimension times its constant repeat count.
pub(super) fn tile(c: &Ctx<'_, '_>) -> Result<Vec<Info>> {
    let x = c.ins.get(0)?;
    let repeats = c.ins.value(1)?;
    if repeats.len() != x.shape.len() {
        return Err(ShapeError::Attribute {
            name: "repeats",
            problem: "does not have one value per dimension",
        });
    }
    let shape = x
        .shape
        .iter()
        .zip(repeats)
        .map(|(&d, &r)| ck(d.checked_mul(dim(r)?)))
        .collect::<Result<_>>()?;
    Ok(vec![Info::new(x.dtype, shape)])
}

/// `Resize` and `Upsample`: constant `sizes`, or `floor(dimension × scale)` for constant `scales`.
pub(super) fn resize(c: &Ctx<'_, '_>) -> Result<Vec<Info>> {
    let (at, ins) = (&c.at, &c.ins);
    let x = ins.get(0)?;
    let r = x.shape.len();
    let upsample = c.node.op_type == "Upsample";
    let attr_scales: Vec<f64>;
    let (scales, sizes): (Option<&[f64]>, Option<&[i64]>) = if upsample && c.opset < 9 {
        attr_scales = at
            .floats("scales")
            .ok_or_else(|| missing("scales"))?
            .iter()
            .map(|&f| f64::from(f))
            .collect();
        (Some(&attr_scales), None)
    } else if upsample || c.opset < 11 {
        (ins.opt_floats(1)?, None)
    } else {
        let sizes = ins.opt_value(3)?.filter(|s| !s.is_empty());
        (
            if sizes.is_some() {
                None
            } else {
                ins.opt_floats(2)?
            },
            sizes,
        )
    };
    let axes: Vec<usize> = match at.ints("axes") {
        Some(a) => a.iter().map(|&a| axis(a, r)).collect::<Result<_>>()?,
        None => (0..r).collect(),
    };
    let policy = at.string("keep_aspect_ratio_policy").unwrap_or(b"stretch");
    if sizes.is_some() && policy != b"stretch" {
        return Err(ShapeError::Attribute {
            name: "keep_aspect_ratio_policy",
            problem: "other than stretch is not supported",
        });
    }
    let wrong = |name| ShapeError::Attribute {
        name,
        problem: "does not have one value per resized axis",
    };
    let mut shape = x.shape.clone();
    match (sizes, scales) {
        (Some(sizes), _) => {
            if sizes.len() != axes.len() {
                return Err(wrong("sizes"));
            }
            for (&a, &d) in axes.iter().zip(sizes) {
                shape[a] = dim(d)?;
            }
        }
        (None, Some(scales)) => {
            if scales.len() != axes.len() {
                return Err(wrong("scales"));
            }
            for (&a, &s) in axes.iter().zip(scales) {
                // Exact in f64 below 2^53; larger or non-finite results are rejected.
                const EXACT: f64 = 9_007_199_254_740_992.0;
                let d = u32::try_from(shape[a]).map_err(|_| ShapeError::Overflow)?;
                let v = (f64::from(d) * s).floor();
                if !(0.0..EXACT).contains(&v) {
                    return Err(ShapeError::Attribute {
                        name: "scales",
                        problem: "gives a negative, infinite or too large dimension",
                    });
                }
                // `v` is a whole number in [0, 2^53): the conversion is exact.
                shape[a] = v as u64;
            }
        }
        (None, None) => return Err(ShapeError::NotConstant { index: 2 }),
    }
    Ok(vec![Info::new(x.dtype, shape)])
}
