//! Linear algebra (`Gemm`, `MatMul`) and reductions (`Reduce*`, `ArgMax`/`ArgMin`, `TopK`).

use super::{axis, broadcast, dim, dtype, missing, Ctx, Info, Result, ShapeError};

/// The `Reduce` family: `axes` from the attribute or (ReduceSum from opset 13, the rest from 18)
/// an input, every axis when empty (unless `noop_with_empty_axes`), kept as 1 with `keepdims`.
pub(super) fn reduce(c: &Ctx<'_, '_>) -> Result<Vec<Info>> {
    let (node, opset, at, ins) = (c.node, c.opset, &c.at, &c.ins);
    let x = ins.get(0)?;
    let axes_from_input = opset >= 18 || (opset >= 13 && node.op_type == "ReduceSum");
    let axes: Vec<i64> = if axes_from_input {
        ins.opt_value(1)?.map(<[i64]>::to_vec).unwrap_or_default()
    } else {
        at.ints("axes").map(<[i64]>::to_vec).unwrap_or_default()
    };
    if axes.is_empty() && at.int_or("noop_with_empty_axes", 0) != 0 {
        return Ok(vec![Info::new(x.dtype, x.shape.clone())]);
    }
    let r = x.shape.len();
    let axes: Vec<usize> = if axes.is_empty() {
        (0..r).collect()
    } else {
        axes.iter().map(|&a| axis(a, r)).collect::<Result<_>>()?
    };
    let keepdims = at.int_or("keepdims", 1) != 0;
    Ok(vec![Info::new(x.dtype, reduced(&x.shape, &axes, keepdims))])
}

/// `ArgMax` and `ArgMin`: INT64 indices along `axis`.
pub(super) fn arg(c: &Ctx<'_, '_>) -> Result<Vec<Info>> {
    let (at, ins) = (&c.at, &c.ins);
    let x = ins.get(0)?;
    let a = axis(at.int_or("axis", 0), x.shape.len())?;
    Ok(vec![Info::new(
        dtype::INT64,
        reduced(&x.shape, &[a], at.int_or("keepdims", 1) != 0),
    )])
}

/// `TopK`: values and INT64 indices, `K` (capped at the dimension) along `axis`.
pub(super) fn top_k(c: &Ctx<'_, '_>) -> Result<Vec<Info>> {
    let (opset, at, ins) = (c.opset, &c.at, &c.ins);
    let x = ins.get(0)?;
    let a = axis(at.int_or("axis", -1), x.shape.len())?;
    let k = if opset < 10 {
        at.int("k").ok_or_else(|| missing("k"))?
    } else {
        match ins.value(1)? {
            [k] => *k,
            _ => {
                return Err(ShapeError::Attribute {
                    name: "K",
                    problem: "is not a single value",
                })
            }
        }
    };
    let mut shape = x.shape.clone();
    shape[a] = dim(k)?.min(shape[a]);
    Ok(vec![
        Info::new(x.dtype, shape.clone()),
        Info::new(dtype::INT64, shape),
    ])
}

/// `Gemm`: `[M, K] × [K, N]`, either operand transposed by `transA`/`transB`.
pub(super) fn gemm(c: &Ctx<'_, '_>) -> Result<Vec<Info>> {
    let (at, ins) = (&c.at, &c.ins);
    let (a, b) = (ins.get(0)?, ins.get(1)?);
    for (i, t) in [(0, a), (1, b)] {
        if t.shape.len() != 2 {
            return Err(ShapeError::Rank {
                index: i,
                rank: t.shape.len(),
                expected: "2",
            });
        }
    }
    let (m, k) = if at.int_or("transA", 0) != 0 {
        (a.shape[1], a.shape[0])
    } else {
        (a.shape[0], a.shape[1])
    };
    let (k2, n) = if at.int_or("transB", 0) != 0 {
        (b.shape[1], b.shape[0])
    } else {
        (b.shape[0], b.shape[1])
    };
    if k != k2 {
        return Err(ShapeError::Mismatch {
            what: "Gemm inner dimensions",
            left: k,
            right: k2,
        });
    }
    Ok(vec![Info::new(a.dtype, vec![m, n])])
}

/// `MatMul`: numpy `matmul` with batch broadcasting.
pub(super) fn mat_mul(c: &Ctx<'_, '_>) -> Result<Vec<Info>> {
    let ins = &c.ins;
    let (a, b) = (ins.get(0)?, ins.get(1)?);
    Ok(vec![Info::new(a.dtype, matmul(&a.shape, &b.shape)?)])
}

/// `shape` with `axes` reduced: kept as 1 or dropped.
fn reduced(shape: &[u64], axes: &[usize], keepdims: bool) -> Vec<u64> {
    shape
        .iter()
        .enumerate()
        .filter_map(|(i, &d)| match (axes.contains(&i), keepdims) {
            (false, _) => Some(d),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect()
}

/// Numpy `matmul` shapes (1-D operands promoted and the added axis removed again).
fn matmul(a: &[u64], b: &[u64]) -> Result<Vec<u64>> {
    for (index, s) in [(0, a), (1, b)] {
        if s.is_empty() {
            return Err(ShapeError::Rank {
                index,
                rank: 0,
                expected: "at least 1",
            });
        }
    }
    let a2: Vec<u64> = if a.len() == 1 {
        vec![1, a[0]]
    } else {
        a.to_vec()
    };
    let b2: Vec<u64> = if b.len() == 1 {
        vec![b[0], 1]
    } else {
        b.to_vec()
    };
    let (ra, rb) = (a2.len(), b2.len());
    if a2[ra - 1] != b2[rb - 2] {
        return Err(ShapeError::Mismatch {
            what: "MatMul inner dimensions",
            left: a2[ra - 1],
            right: b2[rb - 2],
        });
    }
    let mut out = broadcast(&a2[..ra - 2], &b2[..rb - 2])?;
    if a.len() > 1 {
        out.push(a2[ra - 2]);
    }
    if b.len() > 1 {
        out.push(b2[rb - 1]);
    }
    Ok(out)
}
