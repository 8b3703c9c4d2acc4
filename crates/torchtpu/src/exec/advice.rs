//! Advice on shapes a TPU pads or under-fills: every matrix product and
//! convolution an op's plan holds is measured against the TPU's tiles when
//! the plan is built (once per signature), and the wasteful ones are kept
//! with the model's source line (`torchtpu.advise()`).
//!
//! A TPU lays an array's two minor dimensions out in tiles of 8 (16 for
//! 2-byte, 32 for 1-byte types) by 128, and its matrix unit multiplies 128-wide
//! blocks: a product's contracting and output dimensions pad to 128, its rows
//! to the tile's height, and fewer than 128 rows leave the unit partly idle.
//! The estimate reasons about shapes only, so it is the same on every plugin.
use std::sync::Mutex;

use crate::exec::FxMap;
use crate::ir::dtype::DType;
use crate::ir::{Graph, Op};

/// The matrix unit's width, and the fewest rows that fill it.
const LANES: i64 = 128;
/// Smaller products are not worth a line (multiply-adds).
const SMALLEST: i64 = 1 << 16;
/// Less padded work than this is not reported.
const NEGLIGIBLE: f64 = 0.05;

/// A product or convolution whose shapes waste part of the matrix unit.
#[derive(Clone)]
pub struct Finding {
    /// "matrix product", "batched matrix product" or "convolution".
    pub kind: &'static str,
    pub op: String,
    /// `file.py:42` of the model code that called the op, if known.
    pub source: Option<String>,
    pub dtype: DType,
    pub lhs: Vec<i64>,
    pub rhs: Vec<i64>,
    /// Rows, contracting size and columns of one product (a convolution's
    /// output positions, input features and output features).
    pub mkn: [i64; 3],
    /// The fraction of the matrix unit's work spent on padding or idle rows.
    pub wasted: f64,
    /// What causes it and the change that removes it, one line each.
    pub reasons: Vec<String>,
    /// Plans of this op, shapes and line.
    pub count: usize,
}

static FINDINGS: Mutex<Option<FxMap<(String, Option<String>, Vec<i64>, Vec<i64>), Finding>>> = Mutex::new(None);

fn round_up(x: i64, to: i64) -> i64 {
    (x + to - 1) / to * to
}

/// The rows a tile of `dtype` holds.
fn sublanes(dtype: DType) -> i64 {
    match dtype.size() {
        1 => 32,
        2 => 16,
        _ => 8,
    }
}

/// Measures the products of `g` (the plan of `op`), keeping wasteful ones.
pub fn note(op: &str, g: &Graph) {
    let mut found = Vec::new();
    for node in &g.nodes {
        let (lhs, rhs) = (g.ty(node.args.first().copied().unwrap_or(0)), g.ty(node.args.get(1).copied().unwrap_or(0)));
        let (kind, mkn) = match &node.op {
            Op::DotGeneral { lhs_batch, lhs_contract, rhs_batch, rhs_contract, .. } => {
                let size = |shape: &[i64], dims: &[i64]| dims.iter().map(|&d| shape[d as usize]).product::<i64>();
                let free = |shape: &[i64], batch: &[i64], contract: &[i64]| {
                    (0..shape.len() as i64)
                        .filter(|d| !batch.contains(d) && !contract.contains(d))
                        .map(|d| shape[d as usize])
                        .product::<i64>()
                };
                let kind = if lhs_batch.is_empty() { "matrix product" } else { "batched matrix product" };
                let m = free(&lhs.shape, lhs_batch, lhs_contract);
                let n = free(&rhs.shape, rhs_batch, rhs_contract);
                (kind, [m, size(&lhs.shape, lhs_contract), n])
            }
            Op::Convolution(c, _) => {
                let out = &node.ty.shape;
                let rows = out[c.out[0] as usize] * c.out[2..].iter().map(|&d| out[d as usize]).product::<i64>();
                (
                    "convolution",
                    [rows, lhs.shape[c.lhs[1] as usize] / c.feature_groups.max(1), rhs.shape[c.rhs[0] as usize]],
                )
            }
            _ => continue,
        };
        if let Some(f) = measure(kind, op, lhs.dtype, &lhs.shape, &rhs.shape, mkn) {
            found.push(f);
        }
    }
    if found.is_empty() {
        return;
    }
    let source = crate::exec::trace::source_line();
    let mut guard = FINDINGS.lock().unwrap();
    let all = guard.get_or_insert_with(FxMap::default);
    for mut f in found {
        f.source = source.clone();
        let key = (f.op.clone(), f.source.clone(), f.lhs.clone(), f.rhs.clone());
        all.entry(key).and_modify(|e| e.count += 1).or_insert(f);
    }
}

/// The finding of one product of `kind`, if it wastes enough to report.
fn measure(kind: &'static str, op: &str, dtype: DType, lhs: &[i64], rhs: &[i64], mkn: [i64; 3]) -> Option<Finding> {
    let [m, k, n] = mkn;
    if m * k * n < SMALLEST || !(dtype.is_float() || dtype.is_int()) {
        return None;
    }
    // Rows pad to the tile's height, and fewer than 128 leave the unit idle.
    let rows = round_up(m, sublanes(dtype)).max(LANES);
    let padded = rows as f64 * round_up(k, LANES) as f64 * round_up(n, LANES) as f64;
    let wasted = 1.0 - (m * k * n) as f64 / padded;
    if wasted < NEGLIGIBLE {
        return None;
    }
    let mut reasons = Vec::new();
    let (contracting, columns) = match kind {
        "convolution" => ("input channels", "output channels"),
        _ => ("contracting dimension", "output dimension"),
    };
    // A batched product's narrow contracting or output dimension is
    // attention's head dimension (Q·Kᵀ contracts over it, P·V yields it).
    let head = kind == "batched matrix product";
    for (what, size) in [(contracting, k), (columns, n)] {
        if size % LANES == 0 {
            continue;
        }
        let to = round_up(size, LANES);
        let change = if head {
            format!("an attention head dimension of {size}: use heads of 128 or 256 (fewer, wider heads)")
        } else {
            format!("make it {to} (a hidden size, channel count or vocabulary padded to 128)")
        };
        let share = 100.0 * (1.0 - size as f64 / to as f64);
        reasons.push(format!(
            "{what} {size} is not a multiple of 128: it pads to {to} ({share:.0}% of it padding); {change}"
        ));
    }
    let sub = sublanes(dtype);
    if m % sub != 0 {
        reasons.push(format!(
            "rows {m} are not a multiple of {sub} (the {} tile's height): make batch x sequence a multiple of {sub}",
            dtype.torch_name()
        ));
    }
    if m < LANES {
        reasons.push(format!(
            "only {m} rows per product fill {:.0}% of the 128-row matrix unit: put more rows (batch x sequence, \
             or batched heads) into each product",
            100.0 * m as f64 / LANES as f64
        ));
    }
    Some(Finding {
        kind,
        op: op.to_string(),
        source: None,
        dtype,
        lhs: lhs.to_vec(),
        rhs: rhs.to_vec(),
        mkn,
        wasted,
        reasons,
        count: 1,
    })
}

/// What was found since the process started (or the last `clear`), the
/// most wasteful first. Products met without a Python frame (the autograd
/// engine's thread runs backward) take the line of a forward product of the
/// same three sizes: a gradient of `[m, k] x [k, n]` is `[m, n] x [n, k]` or
/// `[k, m] x [m, n]`.
pub fn findings() -> Vec<Finding> {
    let mut all: Vec<Finding> = FINDINGS.lock().unwrap().as_ref().map_or(Vec::new(), |m| m.values().cloned().collect());
    let sizes = |f: &Finding| {
        let mut s = f.mkn;
        s.sort_unstable();
        s
    };
    let forward: Vec<([i64; 3], String)> = all.iter().filter_map(|f| Some((sizes(f), f.source.clone()?))).collect();
    for f in all.iter_mut().filter(|f| f.source.is_none()) {
        let line = forward.iter().find(|(s, _)| *s == sizes(f)).map(|(_, line)| line);
        f.source = Some(line.map_or("(backward)".to_string(), |line| format!("{line} (backward)")));
    }
    all.sort_by(|a, b| b.wasted.total_cmp(&a.wasted).then_with(|| a.source.cmp(&b.source)));
    all
}

pub fn clear() {
    *FINDINGS.lock().unwrap() = None;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_products_are_not_reported_and_others_are_measured() {
        let f32 = DType::F32;
        assert!(measure("matrix product", "aten::mm", f32, &[256, 256], &[256, 512], [256, 256, 512]).is_none());
        // A hidden size of 96: contracting and output dimensions pad to 128.
        let f = measure("matrix product", "aten::addmm", f32, &[256, 96], &[96, 96], [256, 96, 96]).unwrap();
        assert!((f.wasted - (1.0 - 96.0 * 96.0 / (128.0 * 128.0))).abs() < 1e-9 && f.reasons.len() == 2);
        // Attention with heads of 64: Q·Kᵀ contracts over 64.
        let f =
            measure("batched matrix product", "aten::bmm", f32, &[8, 128, 64], &[8, 64, 128], [128, 64, 128]).unwrap();
        assert!((f.wasted - 0.5).abs() < 1e-9 && f.reasons[0].contains("attention head dimension of 64"));
        // 16 rows of bfloat16: a whole tile, an eighth of the matrix unit.
        let bf16 = DType::BF16;
        let f = measure("matrix product", "aten::mm", bf16, &[16, 1024], &[1024, 1024], [16, 1024, 1024]).unwrap();
        assert!((f.wasted - 0.875).abs() < 1e-9 && f.reasons.len() == 1);
    }
}
