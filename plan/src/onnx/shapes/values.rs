//! Shape computations whose values are known statically (`Shape`, `Size`, `Gather`, `Range`)
//! and constants (`Constant`, `ConstantOfShape`).

use super::{axis, ck, dim, dtype, Attrs, Ctx, Info, Result, ShapeError, MAX_VALUES};
use crate::onnx::proto::Node;

/// `Shape` (with opset 15's `start` and `end`): the value is known.
pub(super) fn shape(c: &Ctx<'_, '_>) -> Result<Vec<Info>> {
    let at = &c.at;
    let ins = &c.ins;
    let x = ins.get(0)?;
    let r = i64::try_from(x.shape.len()).map_err(|_| ShapeError::Overflow)?;
    let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r);
    let start = usize::try_from(clamp(at.int_or("start", 0))).unwrap_or(0);
    let end = usize::try_from(clamp(at.int_or("end", r))).unwrap_or(0);
    let dims = x.shape.get(start..end.max(start)).unwrap_or(&[]);
    let value = dims
        .iter()
        .map(|&d| i64::try_from(d).map_err(|_| ShapeError::Overflow))
        .collect::<Result<Vec<_>>>()?;
    let len = u64::try_from(value.len()).map_err(|_| ShapeError::Overflow)?;
    Ok(vec![Info {
        dtype: dtype::INT64,
        shape: vec![len],
        value: Some(value),
        floats: None,
    }])
}

/// `Size`: the value is known.
pub(super) fn size(c: &Ctx<'_, '_>) -> Result<Vec<Info>> {
    let ins = &c.ins;
    let x = ins.get(0)?;
    let n = i64::try_from(ck(x.elements())?).map_err(|_| ShapeError::Overflow)?;
    Ok(vec![Info {
        dtype: dtype::INT64,
        shape: vec![],
        value: Some(vec![n]),
        floats: None,
    }])
}

/// `Gather`; a 1-D constant gathered by constant indices keeps its values.
pub(super) fn gather(c: &Ctx<'_, '_>) -> Result<Vec<Info>> {
    let at = &c.at;
    let ins = &c.ins;
    let (x, idx) = (ins.get(0)?, ins.get(1)?);
    let r = x.shape.len();
    if r == 0 {
        return Err(ShapeError::Rank {
            index: 0,
            rank: 0,
            expected: "at least 1",
        });
    }
    let a = axis(at.int_or("axis", 0), r)?;
    let mut shape = x.shape[..a].to_vec();
    shape.extend_from_slice(&idx.shape);
    shape.extend_from_slice(&x.shape[a + 1..]);
    let value = match (&x.value, &idx.value) {
        (Some(v), Some(i)) if r == 1 => i
            .iter()
            .map(|&i| {
                let n = i64::try_from(v.len()).ok()?;
                let j = usize::try_from(if i < 0 { i + n } else { i }).ok()?;
                v.get(j).copied()
            })
            .collect::<Option<Vec<_>>>(),
        _ => None,
    };
    Ok(vec![Info {
        dtype: x.dtype,
        shape,
        value,
        floats: None,
    }])
}

/// `ConstantOfShape`: the shape is its input's value.
pub(super) fn constant_of_shape(c: &Ctx<'_, '_>) -> Result<Vec<Info>> {
    let at = &c.at;
    let ins = &c.ins;
    let shape = ins
        .value(0)?
        .iter()
        .map(|&d| dim(d))
        .collect::<Result<Vec<_>>>()?;
    let dt = at.tensor("value").map_or(dtype::FLOAT, |t| t.data_type);
    Ok(vec![Info::new(dt, shape)])
}

/// A `Constant` node's value.
pub(super) fn constant(node: &Node) -> Result<Info> {
    let at = Attrs(node);
    let attr = node.attribute.first().ok_or(ShapeError::Attribute {
        name: "value",
        problem: "is missing (a Constant needs exactly one value attribute)",
    })?;
    let n = |len: usize| u64::try_from(len).map_err(|_| ShapeError::Overflow);
    Ok(match attr.name.as_str() {
        "value" => {
            let t = at.tensor("value").ok_or(ShapeError::Attribute {
                name: "value",
                problem: "is not a tensor",
            })?;
            Info::of_tensor(t).ok_or(ShapeError::Attribute {
                name: "value",
                problem: "has a negative dimension",
            })?
        }
        "value_float" => Info {
            floats: Some(vec![f64::from(attr.f)]),
            ..Info::new(dtype::FLOAT, vec![])
        },
        "value_floats" => Info {
            floats: Some(attr.floats.iter().map(|&f| f64::from(f)).collect()),
            ..Info::new(dtype::FLOAT, vec![n(attr.floats.len())?])
        },
        "value_int" => Info {
            dtype: dtype::INT64,
            shape: vec![],
            value: Some(vec![attr.i]),
            floats: None,
        },
        "value_ints" => Info {
            dtype: dtype::INT64,
            shape: vec![n(attr.ints.len())?],
            value: Some(attr.ints.clone()),
            floats: None,
        },
        // value_string(s), sparse_value: not numeric tensors.
        _ => return Err(ShapeError::Unsupported),
    })
}

/// The longest `Range` inferred (2^32 elements).
const RANGE_MAX: f64 = 4_294_967_296.0;

/// `Range`: `ceil((limit - start) / delta)` elements (at least 0) from constant scalars.
pub(super) fn range(c: &Ctx<'_, '_>) -> Result<Vec<Info>> {
    let ins = &c.ins;
    let first = ins.get(0)?;
    let scalar = |i: usize| -> Result<f64> {
        let t = ins.get(i)?;
        match (&t.value, &t.floats) {
            // Integer bounds above 2^53 round: a Range that long is rejected below anyway.
            (Some(v), _) if v.len() == 1 => Ok(v[0] as f64),
            (_, Some(f)) if f.len() == 1 => Ok(f[0]),
            _ => Err(ShapeError::NotConstant { index: i }),
        }
    };
    let (start, limit, delta) = (scalar(0)?, scalar(1)?, scalar(2)?);
    let n = ((limit - start) / delta).ceil().max(0.0);
    if !n.is_finite() || n > RANGE_MAX {
        return Err(ShapeError::Attribute {
            name: "delta",
            problem: "gives no finite element count",
        });
    }
    // `n` is a whole number in [0, 2^32]: the conversion is exact.
    let n = n as u64;
    let value = match (&first.value, &ins.get(1)?.value, &ins.get(2)?.value) {
        (Some(s), Some(_), Some(d)) if usize::try_from(n).is_ok_and(|n| n <= MAX_VALUES) => (0..n)
            .map(|i| s[0].checked_add(d[0].checked_mul(i64::try_from(i).ok()?)?))
            .collect(),
        _ => None,
    };
    Ok(vec![Info {
        value,
        ..Info::new(first.dtype, vec![n])
    }])
}
