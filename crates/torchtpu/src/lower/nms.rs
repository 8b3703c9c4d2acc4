//! torchvision's `nms` (every detection model's post-processing and box
//! sampling): greedy non-maximum suppression with CPU's IoU, exact, without
//! a loop in the IR. Boxes sorted by decreasing score (ties by index, as
//! CPU's stable sort), box `i` is kept iff no kept earlier box overlaps it
//! beyond the threshold. That condition's one fixed point is the greedy
//! result, and the iteration `keep' = no kept earlier box overlaps`, from
//! all kept, reaches it after as many rounds as the longest chain of
//! suppressions: the entry's measure iterates up to `ROUNDS` rounds on the
//! device and reads how many it took and how many boxes stay (one read, where
//! CUDA's kernel copies its suppression bitmask to the host); the lowering
//! runs at least that many rounds and returns the kept indices. Chains longer than
//! `ROUNDS` run on the CPU (counted).
use super::{op_measured, Cx, Entry};
use crate::error::{Error, Result};
use crate::ir::dtype::{opmath, DType};
use crate::ir::{ReduceKind, V};

pub static ENTRIES: &[Entry] = &[op_measured("torchvision::nms", nms, measure)];

/// Most rounds the measure runs.
const ROUNDS: i64 = 32;

/// Fewest rounds the lowering runs: most chains are shorter (a detection
/// model's: 3 to 5), and a round costs less than the overlaps it reads.
const FEWEST: i64 = 8;

/// `later[i][j]`: box `j` comes before box `i` in score order and overlaps
/// it beyond the threshold ([n, n], bool), the boxes' order (i64 [n]).
fn suppression(cx: &mut Cx) -> Result<(V, V)> {
    let (d, s) = (cx.meta("dets")?, cx.meta("scores")?);
    if d.sizes.len() != 2 || d.sizes[1] != 4 {
        return Err(Error::runtime(format!(
            "boxes should have 4 elements in dimension 1, got {}",
            d.sizes.get(1).unwrap_or(&0)
        )));
    }
    if s.sizes.len() != 1 || s.sizes[0] != d.sizes[0] {
        return Err(Error::runtime("boxes and scores should have same number of elements in dimension 0"));
    }
    let n = d.sizes[0];
    let ct = opmath(d.dtype);
    let scores = cx.tensor("scores")?;
    let scores = cx.g.convert(scores, ct);
    // Descending by score, then ascending by index: both keys descending.
    let index = cx.g.iota(DType::I64, &[n], 0);
    let minus_index = cx.g.unary("stablehlo.negate", index);
    let sorted = cx.g.sort(&[scores, minus_index], 0, true, 2);
    let order = cx.g.unary("stablehlo.negate", sorted[1]);
    let dets = cx.tensor("dets")?;
    let dets = cx.g.convert(dets, ct);
    let dets = cx.g.take(dets, order, 0);
    let column = |cx: &mut Cx, c: i64| {
        let x = cx.g.slice(dets, &[0, c], &[n, c + 1], &[1, 1]);
        cx.g.reshape(x, &[n])
    };
    let [x1, y1, x2, y2] = [0, 1, 2, 3].map(|c| column(cx, c));
    let width = cx.g.binary("stablehlo.subtract", x2, x1);
    let height = cx.g.binary("stablehlo.subtract", y2, y1);
    let area = cx.g.binary("stablehlo.multiply", width, height);
    // Row i, column j.
    let rows = |cx: &mut Cx, v: V| cx.g.broadcast_in_dim(v, &[n, n], &[0]);
    let cols = |cx: &mut Cx, v: V| cx.g.broadcast_in_dim(v, &[n, n], &[1]);
    let zero = cx.g.full(0.0, ct, &[n, n]);
    let side = |cx: &mut Cx, lo: V, hi: V| {
        let (lo_i, lo_j, hi_i, hi_j) = (rows(cx, lo), cols(cx, lo), rows(cx, hi), cols(cx, hi));
        let start = cx.g.binary("stablehlo.maximum", lo_i, lo_j);
        let end = cx.g.binary("stablehlo.minimum", hi_i, hi_j);
        let length = cx.g.binary("stablehlo.subtract", end, start);
        cx.g.binary("stablehlo.maximum", length, zero)
    };
    let (w, h) = (side(cx, x1, x2), side(cx, y1, y2));
    let inter = cx.g.binary("stablehlo.multiply", w, h);
    let (area_i, area_j) = (rows(cx, area), cols(cx, area));
    let union = cx.g.binary("stablehlo.add", area_i, area_j);
    let union = cx.g.binary("stablehlo.subtract", union, inter);
    let iou = cx.g.binary("stablehlo.divide", inter, union);
    let threshold = cx.scalar_like("iou_threshold", ct, &[n, n])?.expect("iou_threshold");
    let overlaps = cx.g.compare("GT", iou, threshold);
    let i = cx.g.iota(DType::I64, &[n, n], 0);
    let j = cx.g.iota(DType::I64, &[n, n], 1);
    let earlier = cx.g.compare("LT", j, i);
    Ok((cx.g.binary("stablehlo.and", overlaps, earlier), order))
}

/// One round: a box stays unless a box kept in `keep` suppresses it.
fn round(cx: &mut Cx, later: V, keep: V) -> V {
    let n = cx.g.ty(keep).shape[0];
    let kept = cx.g.broadcast_in_dim(keep, &[n, n], &[1]);
    let hit = cx.g.binary("stablehlo.and", later, kept);
    let hit = cx.g.reduce(ReduceKind::Or, hit, &[1]);
    cx.g.unary("stablehlo.not", hit)
}

/// [boxes kept, rounds to the fixed point] (rounds `ROUNDS + 1`: not reached).
fn measure(cx: &mut Cx) -> Result<Vec<V>> {
    let n = cx.meta("dets")?.sizes[0];
    if n == 0 {
        return Ok(Vec::new());
    }
    let (later, _) = suppression(cx)?;
    let mut keep = cx.g.full(1.0, DType::Bool, &[n]);
    let mut rounds = cx.g.full(0.0, DType::I64, &[]);
    let mut settled = cx.g.full(0.0, DType::Bool, &[]);
    // Round t turns keep_t into keep_t+1; keep_t is the fixed point at the
    // first t where they agree, and `rounds` counts the rounds before it.
    for _ in 0..=ROUNDS {
        let next = round(cx, later, keep);
        let same = cx.g.compare("EQ", next, keep);
        let same = cx.g.reduce(ReduceKind::And, same, &[0]);
        settled = cx.g.binary("stablehlo.or", settled, same);
        let more = cx.g.unary("stablehlo.not", settled);
        let more = cx.g.convert(more, DType::I64);
        rounds = cx.g.binary("stablehlo.add", rounds, more);
        keep = next;
    }
    let count = cx.g.convert(keep, DType::I64);
    let count = cx.g.reduce(ReduceKind::Sum, count, &[0]);
    let parts = [cx.g.reshape(count, &[1]), cx.g.reshape(rounds, &[1])];
    Ok(vec![cx.g.concatenate(&parts, 0)])
}

/// The kept boxes' indices, by decreasing score ([kept], i64).
fn nms(cx: &mut Cx) -> Result<Vec<V>> {
    let n = cx.meta("dets")?.sizes[0];
    if n == 0 {
        return Ok(vec![cx.g.full(0.0, DType::I64, &[0])]);
    }
    let (count, rounds) = (cx.sizes[0], cx.sizes[1]);
    if rounds > ROUNDS {
        return Err(Error::fallback(format!("torchvision::nms: suppression chains longer than {ROUNDS}")));
    }
    let (later, order) = suppression(cx)?;
    let mut keep = cx.g.full(1.0, DType::Bool, &[n]);
    // Rounds past the fixed point keep it, so a power of two of them, at
    // least `FEWEST`, gives the same boxes in a handful of program
    // structures rather than one per chain length (a detection model's
    // chains of 3 to 5 compiled anew at each step that met another).
    for _ in 0..(rounds.max(FEWEST) as u64).next_power_of_two() {
        keep = round(cx, later, keep);
    }
    // Kept positions first, in score order: sorted by (dropped, position).
    let dropped = cx.g.unary("stablehlo.not", keep);
    let dropped = cx.g.convert(dropped, DType::I64);
    let position = cx.g.iota(DType::I64, &[n], 0);
    let sorted = cx.g.sort(&[dropped, position], 0, false, 2);
    let kept = cx.g.slice(sorted[1], &[0], &[count], &[1]);
    Ok(vec![cx.g.take(order, kept, 0)])
}
