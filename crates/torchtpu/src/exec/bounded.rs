//! Bounded dynamic dimensions: a fused program compiled once per bucket of a
//! changing size rather than once per size.
//!
//! Lowerings only ever see real, static shapes. When a flushed trace misses
//! the program cache, its graph's integers (sizes, slice bounds, pad amounts,
//! integral constants) are fitted, across graphs of the same structure up
//! to integers (its *family*), as formulas of the fewest changing sizes that
//! fit: `a*s + b` of one (from two samples), affine in two, three or four
//! (the counts a detection model's box sampling keeps per image), and with
//! the product of the first two (`c0 + c1*s + c2*t + c3*s*t`: a batch and a
//! length, their product a flattened dimension or a mean's count). A trace
//! whose integers hold its family's fit
//! is built for its sizes' buckets (`TORCHTPU_BUCKETS`, else the next power
//! of two): each changing dimension becomes a bounded dynamic dimension of
//! the formula's value at the buckets, whose real size is computed from the
//! sizes, runtime inputs (`stablehlo.set_dimension_size`), and XLA masks
//! reductions, products and the rest over the padding; a constant such as
//! a mean's count is computed from the sizes too. Programs take and return
//! static buffers of their bounds (bounded parameters do not compile,
//! bounded results cannot feed another program), so outputs stay padded
//! ([`DeviceBuffer::padded`]) and feed the next bucketed program as they
//! are; other readers get the real box, copied through the host (`unpad`,
//! counted), as are inputs that arrive in another shape (`repad`). Ops a
//! dynamic dimension may reach are the ones XLA's padding is known to
//! handle; any other keeps the trace static.
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, OnceLock};

use crate::error::Result;
use crate::exec::{FxHasher, FxMap};
use crate::ir::dtype::DType;
use crate::ir::{Graph, Op, Ty, V};
use crate::metrics::{bump, METRICS};
use crate::runtime::storage::DeviceBuffer;
use crate::runtime::{self, cache};

/// Where an integer of a graph sits.
#[derive(Clone, Copy)]
enum Slot {
    /// Dimension `d` of node `v`'s type.
    Dim(V, usize),
    /// Field `f` (start, limit, stride) of a slice's dimension `d`.
    Slice(V, usize, usize),
    /// Field `f` (low, high, interior) of a pad's dimension `d`.
    Pad(V, usize, usize),
    /// An integral constant's value.
    Const(V),
}

/// A graph's integers and a hash of everything else.
struct Scan {
    key: u64,
    ints: Vec<i64>,
    slots: Vec<Slot>,
}

/// A constant's value where it is an integer a size could be (f64 bits for
/// floats, the integer itself for integers; complex and bool excluded).
fn integral(bits: i64, dtype: DType) -> Option<i64> {
    let limit = 1i64 << 31;
    if dtype.is_float() {
        let x = f64::from_bits(bits as u64);
        return (x.fract() == 0.0 && x.abs() < limit as f64).then_some(x as i64);
    }
    (!dtype.is_complex() && dtype != DType::Bool && bits.abs() < limit).then_some(bits)
}

/// A slice's or a pad's three fields, per dimension, as integers of the graph.
fn fields(ints: &mut Vec<i64>, slots: &mut Vec<Slot>, fields: [&Vec<i64>; 3], slot: impl Fn(usize, usize) -> Slot) {
    for (f, field) in fields.into_iter().enumerate() {
        for (d, &x) in field.iter().enumerate() {
            ints.push(x);
            slots.push(slot(f, d));
        }
    }
}

fn scan(g: &Graph) -> Scan {
    let mut h = FxHasher::default();
    let (mut ints, mut slots) = (Vec::new(), Vec::new());
    for (v, node) in g.nodes.iter().enumerate() {
        match &node.op {
            Op::Slice { start, limit, stride } => {
                "slice".hash(&mut h);
                fields(&mut ints, &mut slots, [start, limit, stride], |f, d| Slot::Slice(v, f, d));
            }
            // A pad to a length (a view read out of a growing flat storage).
            Op::Pad { low, high, interior } => {
                "pad".hash(&mut h);
                fields(&mut ints, &mut slots, [low, high, interior], |f, d| Slot::Pad(v, f, d));
            }
            &Op::Const(bits) => match integral(bits, node.ty.dtype) {
                Some(x) => {
                    "const".hash(&mut h);
                    ints.push(x);
                    slots.push(Slot::Const(v));
                }
                None => node.op.hash(&mut h),
            },
            op => op.hash(&mut h),
        }
        node.args.hash(&mut h);
        node.ty.dtype.hash(&mut h);
        node.ty.rank().hash(&mut h);
        for (d, &x) in node.ty.shape.iter().enumerate() {
            ints.push(x);
            slots.push(Slot::Dim(v, d));
        }
    }
    // Not the donors: which dead parameter an output reuses can follow from
    // sizes that happen to be equal (the bucketed program filters them).
    (&g.outputs, g.params.len()).hash(&mut h);
    Scan { key: h.finish(), ints, slots }
}

/// The slots of the dimensions of parameters that came padded and are
/// smaller than their buffer there: sizes that change where they were made.
fn counts(g: &Graph, slots: &[Slot], padded: &[Option<&[i64]>]) -> Vec<usize> {
    let padded_dim = |v: V, d: usize| match g.nodes[v].op {
        Op::Param(n) => padded[n].and_then(|p| p.get(d)).is_some_and(|&p| p > g.nodes[v].ty.shape[d]),
        _ => false,
    };
    (slots.iter().enumerate())
        .filter(|(_, slot)| matches!(**slot, Slot::Dim(v, d) if padded_dim(v, d)))
        .map(|(k, _)| k)
        .collect()
}

/// Whether fused programs are bucketed (on unless `TORCHTPU_DYNAMIC=0`; the
/// whole test suite and the conformance sweep pass with it, sizes below
/// their bucket included).
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("TORCHTPU_DYNAMIC").map_or(true, |v| v != "0"))
}

/// The bucket of a size: the first of `TORCHTPU_BUCKETS` (comma-separated,
/// ascending) that holds it, else the next power of two.
pub fn bucket(s: i64) -> i64 {
    static BUCKETS: OnceLock<Vec<i64>> = OnceLock::new();
    let buckets = BUCKETS.get_or_init(|| {
        let list = std::env::var("TORCHTPU_BUCKETS").unwrap_or_default();
        let mut b: Vec<i64> = list.split(',').filter_map(|x| x.trim().parse().ok()).filter(|&x| x > 0).collect();
        b.sort_unstable();
        b
    });
    buckets.iter().copied().find(|&b| b >= s).unwrap_or_else(|| (s.max(1) as u64).next_power_of_two() as i64)
}

/// A program for a bucket, built from a flushed trace's graph.
pub struct Bucketed {
    /// The graph with bounded dimensions; its last parameters are the sizes.
    pub graph: Graph,
    pub sizes: Vec<i64>,
    /// The buckets it is built for.
    pub buckets: Vec<i64>,
    /// Each output's buffer shape where it is padded.
    pub padded: Vec<Option<Vec<i64>>>,
    /// Whether a slice of an operand of fixed size moves or resizes.
    pub window: bool,
}

/// What launching a bucket's program for one graph takes, its graph gone.
pub struct Launch {
    /// Each of the graph's parameters' shapes in the bucket.
    pub shapes: Vec<Vec<i64>>,
    /// The sizes' values, passed after the parameters.
    pub sizes: Vec<i64>,
    /// Which output each argument (parameters, then sizes) is donated to.
    pub donors: Vec<Option<usize>>,
    pub padded: Vec<Option<Vec<i64>>>,
    /// The bucket graph's node count (for the metrics).
    pub nodes: usize,
}

impl Bucketed {
    pub fn launch(&self) -> Launch {
        let shapes = self.graph.params[..self.graph.params.len() - self.sizes.len()].iter();
        Launch {
            shapes: shapes.map(|t| t.shape.clone()).collect(),
            sizes: self.sizes.clone(),
            donors: self.graph.donors.clone(),
            padded: self.padded.clone(),
            nodes: self.graph.nodes.len(),
        }
    }
}

/// Most changing sizes a structure's integers are fitted in.
const MAX_SIZES: usize = 4;

/// A formula's terms: `1, s0, s1, s0*s1, s2, s3` of the changing sizes
/// (absent sizes are 0): affine in each, and the product of the first two
/// (a batch and a length, their product a flattened dimension).
const TERMS: usize = 2 + MAX_SIZES;

/// The sizes term `k` multiplies.
fn term_sizes(k: usize) -> &'static [usize] {
    const SIZES: [&[usize]; TERMS] = [&[], &[0], &[1], &[0, 1], &[2], &[3]];
    SIZES[k]
}

fn term(k: usize, sizes: &[i64]) -> i128 {
    term_sizes(k).iter().map(|&i| sizes.get(i).map_or(0, |&x| x as i128)).product()
}

/// The terms a fit in `k` sizes tries, in order: affine, then (two sizes)
/// with their product.
fn term_sets(k: usize) -> &'static [&'static [usize]] {
    match k {
        1 => &[&[0, 1]],
        2 => &[&[0, 1, 2], &[0, 1, 2, 3]],
        3 => &[&[0, 1, 2, 4]],
        _ => &[&[0, 1, 2, 4, 5]],
    }
}

/// Coefficients of the terms (`TERMS`) in the changing sizes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct Formula([i64; TERMS]);

impl Formula {
    fn at(&self, sizes: &[i64]) -> i64 {
        (0..TERMS).map(|k| self.0[k] as i128 * term(k, sizes)).sum::<i128>() as i64
    }

    fn changes(&self) -> bool {
        self.0[1..].iter().any(|&c| c != 0)
    }

    /// Its largest value while each size runs from 1 to its bucket: at a
    /// corner of that box (it is linear in each size), the bucket where it
    /// grows, 1 where it shrinks (the negatives left when the positives of a
    /// fixed budget are taken).
    fn bound(&self, buckets: &[i64]) -> i64 {
        let corners = 1usize << buckets.len();
        (0..corners)
            .map(|c| {
                let at: Vec<i64> = (0..buckets.len()).map(|i| if c >> i & 1 == 1 { buckets[i] } else { 1 }).collect();
                self.at(&at)
            })
            .max()
            .unwrap_or(self.0[0])
    }
}

/// Which integers of a structure are its changing sizes, and each
/// integer's formula of them.
struct Fit {
    sizes: Vec<usize>,
    formulas: Vec<Formula>,
}

impl Fit {
    fn sizes(&self, ints: &[i64]) -> Vec<i64> {
        self.sizes.iter().map(|&k| ints[k]).collect()
    }

    fn holds(&self, ints: &[i64]) -> bool {
        let sizes = self.sizes(ints);
        self.formulas.len() == ints.len() && self.formulas.iter().zip(ints).all(|(f, &x)| f.at(&sizes) == x)
    }

    /// As saved in the persistent cache: the sizes' count and slots, then
    /// each formula's coefficients (little-endian i64s).
    fn to_bytes(&self) -> Vec<u8> {
        let sizes = self.sizes.iter().map(|&k| k as i64);
        let words = std::iter::once(self.sizes.len() as i64).chain(sizes).chain(self.formulas.iter().flat_map(|f| f.0));
        words.flat_map(i64::to_le_bytes).collect()
    }

    fn from_bytes(bytes: &[u8]) -> Option<Fit> {
        let words: Vec<i64> = bytes.chunks_exact(8).map(|w| i64::from_le_bytes(w.try_into().unwrap())).collect();
        let n = usize::try_from(*words.first()?).ok().filter(|&n| (1..=MAX_SIZES).contains(&n))?;
        let rest = words.get(1 + n..)?;
        let formulas: Vec<Formula> = rest.chunks_exact(TERMS).map(|c| Formula(c.try_into().unwrap())).collect();
        let sizes: Vec<usize> = words[1..1 + n].iter().map(|&k| k as usize).collect();
        (rest.len() % TERMS == 0 && sizes.iter().all(|&k| k < formulas.len())).then_some(Fit { sizes, formulas })
    }
}

/// Where a structure's fit is saved in the persistent cache.
fn fit_key(structure: u64) -> cache::Key {
    (structure, 0x6669_7436) // "fit6": six terms
}

/// The graph a fit was made on, as it was built: what `sweep` builds other
/// buckets' programs from.
struct Seen {
    graph: Graph,
    slots: Vec<Slot>,
    ints: Vec<i64>,
    padded: Vec<Option<Vec<i64>>>,
}

/// The distinct integers of the latest graphs of one structure that missed
/// its fit (up to `SAMPLES`), and the fit, exact on each (or saved by an
/// earlier process).
#[derive(Default)]
struct Family {
    samples: Vec<Vec<i64>>,
    fit: Option<Arc<Fit>>,
    seen: Option<Arc<Seen>>,
    /// The buckets its programs were built for (the latest `MET`).
    met: Vec<Met>,
}

/// Buckets a family's program was built for, and the shapes its padded
/// parameters took there.
struct Met {
    buckets: Vec<i64>,
    params: Option<Vec<Option<Vec<i64>>>>,
}

const MET: usize = 64;

/// Each size's bucket, or the one above it where the family met that one
/// and not its own: sizes that hover around a bucket's edge (a detection
/// model's ~256 proposals an image, 253 at one step and 260 at the next)
/// share one program rather than compile both. For buckets not met yet, a
/// size within an eighth below its bucket's edge (or on it) takes the one
/// above where an earlier sample of the family (`seen`) was within an
/// eighth above that edge: a fit's first buckets, made when a third count
/// began to change, are not made again a step later for the other side.
fn buckets_for(met: &[Met], sizes: &[i64], seen: &[Vec<i64>]) -> Vec<i64> {
    let own: Vec<i64> = sizes.iter().map(|&s| bucket(s)).collect();
    let within =
        |m: &&Vec<i64>| m.len() == own.len() && m.iter().zip(&own).all(|(&b, &o)| b == o || b == bucket(o + 1));
    let found = met.iter().map(|m| &m.buckets).filter(within).min_by_key(|m| m.iter().product::<i64>()).cloned();
    found.unwrap_or_else(|| {
        let hovers = |i: usize, b: i64| {
            sizes[i] * 8 > b * 7 && seen.iter().any(|x| x.get(i).is_some_and(|&h| h > b && h * 8 <= b * 9))
        };
        own.iter().enumerate().map(|(i, &b)| if hovers(i, b) { bucket(b + 1) } else { b }).collect()
    })
}

const SAMPLES: usize = 8;

/// The formulas of every integer of `samples` in the fewest changing sizes
/// (up to `MAX_SIZES`) that fit them all: affine in one (from two samples),
/// then in two (three; with their product, four), and so on. A size is the
/// integer that changes least (the others are multiples of it), the first in
/// the graph among equals (a parameter's dimension, whose buckets are the
/// user's sizes'); the next one is the least changing integer left unfitted.
fn fit(samples: &[Vec<i64>]) -> std::result::Result<Fit, &'static str> {
    let slots = samples[0].len();
    let change = |k: usize| {
        let values = samples.iter().map(|x| x[k]);
        values.clone().max().unwrap_or(0) - values.min().unwrap_or(0)
    };
    let smallest = |among: &mut dyn Iterator<Item = usize>| among.min_by_key(|&k| (change(k), k));
    let s = smallest(&mut (0..slots).filter(|&k| change(k) != 0)).ok_or("no size changes")?;
    let mut sizes = vec![s];
    loop {
        let mut stray = None;
        for &terms in term_sets(sizes.len()) {
            let Some(formulas) = solve(samples, &sizes, terms) else { continue };
            if formulas.iter().all(Option::is_some) {
                return Ok(Fit { sizes, formulas: formulas.into_iter().map(Option::unwrap).collect() });
            }
            stray = Some((0..slots).filter(|&k| formulas[k].is_none()).collect::<Vec<_>>());
        }
        let stray = stray.ok_or("more sizes change than samples show yet")?;
        if sizes.len() == MAX_SIZES {
            return Err("sizes not affine in 4 changing sizes");
        }
        sizes.push(smallest(&mut stray.into_iter()).expect("a stray integer changes"));
    }
}

/// `fit`, then each integer of `counts` (a size that changes where its
/// value was made, though not yet in these samples) that it leaves constant
/// made a size of its own, added to or taken from every formula whose
/// constant term is that value (at least 2) or its negative, in its place
/// (the negatives left of a budget, `n - positives`):
/// a count that stays the same for some steps and then changes (a detection
/// model's positives of one image) is bucketed from the start, not when it
/// first changes. A guess wrong for an integer only costs a new fit: a fit
/// is used only where it `holds` for every integer.
fn fit_counts(samples: &[Vec<i64>], counts: &[usize]) -> std::result::Result<Fit, &'static str> {
    let mut fit = fit(samples)?;
    for &k in counts {
        let c = fit.formulas[k];
        if fit.sizes.len() == MAX_SIZES || c.changes() || c.0[0] < 2 || fit.sizes.contains(&k) {
            continue;
        }
        let t = (0..TERMS).find(|&t| term_sizes(t) == [fit.sizes.len()]).expect("a linear term per size");
        for f in &mut fit.formulas {
            let sign = if f.0[0] == c.0[0] {
                1
            } else if f.0[0] == -c.0[0] {
                -1
            } else {
                continue;
            };
            f.0[0] = 0;
            f.0[t] = sign;
        }
        fit.sizes.push(k);
    }
    Ok(fit)
}

/// Each integer's formula (coefficients of `terms`) in the sizes at slots
/// `sizes`, where one holds for every sample with integer coefficients:
/// solved exactly (Cramer's rule) on the first samples whose terms are
/// independent; None where no samples are.
fn solve(samples: &[Vec<i64>], sizes: &[usize], terms: &[usize]) -> Option<Vec<Option<Formula>>> {
    let n = terms.len();
    let row = |x: &[i64]| -> Vec<i128> {
        let at: Vec<i64> = sizes.iter().map(|&k| x[k]).collect();
        terms.iter().map(|&t| term(t, &at)).collect()
    };
    let (rows, a, d) = (0u32..1 << samples.len()).filter(|m| m.count_ones() as usize == n).find_map(|m| {
        let rows: Vec<usize> = (0..samples.len()).filter(|r| m >> r & 1 == 1).collect();
        let a: Vec<Vec<i128>> = rows.iter().map(|&r| row(&samples[r])).collect();
        det(&a).filter(|&d| d != 0).map(|d| (rows, a, d))
    })?;
    let formula = |k: usize| {
        if samples.iter().all(|x| x[k] == samples[0][k]) {
            let mut c = [0; TERMS];
            c[0] = samples[0][k];
            return Some(Formula(c));
        }
        let mut c = [0i64; TERMS];
        for (i, &t) in terms.iter().enumerate() {
            let mut m = a.clone();
            m.iter_mut().zip(&rows).for_each(|(row, &r)| row[i] = samples[r][k] as i128);
            let num = det(&m)?;
            if num % d != 0 {
                return None;
            }
            c[t] = i64::try_from(num / d).ok()?;
        }
        let f = Formula(c);
        samples.iter().all(|x| f.at(&sizes.iter().map(|&j| x[j]).collect::<Vec<_>>()) == x[k]).then_some(f)
    };
    Some((0..samples[0].len()).map(formula).collect())
}

/// The determinant of a small square matrix (None on overflow).
fn det(m: &[Vec<i128>]) -> Option<i128> {
    if m.len() == 1 {
        return Some(m[0][0]);
    }
    let mut sum: i128 = 0;
    for (j, &a) in m[0].iter().enumerate().filter(|(_, &a)| a != 0) {
        let minor: Vec<Vec<i128>> = m[1..].iter().map(|r| [&r[..j], &r[j + 1..]].concat()).collect();
        let term = a.checked_mul(det(&minor)?)?;
        sum = if j % 2 == 0 { sum.checked_add(term)? } else { sum.checked_sub(term)? };
    }
    Some(sum)
}

/// Each structure's family, by `Scan::key`.
static FAMILIES: Mutex<Option<FxMap<u64, Family>>> = Mutex::new(None);

/// The program of `g` for its bucket, if `g`'s integers are formulas of one
/// or two changing sizes (fitted on graphs of its structure) and
/// every op a changing dimension reaches takes it dynamically. `padded` are
/// the shapes of its parameters' buffers that are padded.
pub fn generalize(g: &Graph, padded: &[Option<&[i64]>]) -> Option<Bucketed> {
    generalize_with(g, padded, true)
}

/// `generalize`, its fits saved in (and read from) the persistent cache
/// where `persist`.
fn generalize_with(g: &Graph, padded: &[Option<&[i64]>], persist: bool) -> Option<Bucketed> {
    let scan = scan(g);
    let mut guard = FAMILIES.lock().unwrap();
    let families = guard.get_or_insert_with(FxMap::default);
    if families.len() >= 1024 && !families.contains_key(&scan.key) {
        families.clear();
    }
    let family = families.entry(scan.key).or_insert_with(|| Family {
        fit: persist.then(|| cache::saved(fit_key(scan.key))).flatten().and_then(|b| Fit::from_bytes(&b)).map(Arc::new),
        ..Family::default()
    });
    if !family.fit.as_ref().is_some_and(|f| f.holds(&scan.ints)) {
        if !family.samples.contains(&scan.ints) {
            if family.samples.len() == SAMPLES {
                family.samples.remove(0);
            }
            family.samples.push(scan.ints.clone());
        }
        if family.samples.len() < 2 {
            return None;
        }
        // A fit that fails leaves the last one for the traces it holds.
        match fit_counts(&family.samples, &counts(g, &scan.slots, padded)) {
            Ok(f) => {
                if persist {
                    cache::save(fit_key(scan.key), &f.to_bytes());
                }
                family.fit = Some(Arc::new(f));
                let padded = padded.iter().map(|p| p.map(<[i64]>::to_vec)).collect();
                let seen = Seen { graph: g.clone(), slots: scan.slots.clone(), ints: scan.ints.clone(), padded };
                family.seen = Some(Arc::new(seen));
            }
            Err(why) => return refuse(why),
        }
    }
    let fit = family.fit.clone()?;
    let sizes = fit.sizes(&scan.ints);
    if sizes.iter().any(|&s| s <= 0) {
        return None;
    }
    let seen: Vec<Vec<i64>> = family.samples.iter().map(|x| fit.sizes(x)).collect();
    let buckets = buckets_for(&family.met, &sizes, &seen);
    let met = match family.met.iter().position(|m| m.buckets == buckets) {
        Some(k) => &family.met[k],
        None => {
            if family.met.len() == MET {
                family.met.remove(0);
            }
            family.met.push(Met { buckets: buckets.clone(), params: None });
            family.met.last().unwrap()
        }
    };
    let took = met.params.clone();
    drop(guard);
    let built = Builder::new(g, &scan.slots, &fit.formulas, &buckets).build(padded, took.as_deref().unwrap_or(&[]))?;
    if took.is_none() {
        let shapes =
            (g.params.iter().zip(&built.graph.params)).map(|(p, b)| (p.shape != b.shape).then(|| b.shape.clone()));
        let mut guard = FAMILIES.lock().unwrap();
        let met = guard
            .as_mut()
            .and_then(|f| f.get_mut(&scan.key))
            .and_then(|f| f.met.iter_mut().find(|m| m.buckets == buckets));
        if let Some(met) = met.filter(|m| m.params.is_none()) {
            met.params = Some(shapes.collect());
        }
    }
    Some(Bucketed { sizes, ..built })
}

/// `generalize` for a per-op program (strict, debug). Its fits are not
/// saved: a later run of a script meets its plans in the same order, fits
/// them at the same points and so finds every program its first run
/// compiled (a saved fit would generalize plans that run compiled as they
/// were, or with an earlier fit).
///
/// Only where its sizes change as a step's sizes do: a count it measured
/// on the device (`measured`), a slice of a tensor of fixed size that moves
/// or resizes (a window, a prefix `pe[:L]`), inputs padded by an earlier
/// bucket, or offsets alone. Elsewhere a changing size is most often the
/// same op at another static shape (a layer's weights of another size,
/// `zeros` of each parameter's): each recurs at every step, and its bucket
/// would pad every value it makes.
pub fn per_op(g: &Graph, padded: &[Option<&[i64]>], measured: bool) -> Option<Bucketed> {
    let b = generalize_with(g, padded, false)?;
    let offsets = b.padded.iter().all(Option::is_none) && b.graph.nodes.iter().all(|n| n.ty.dynamic == 0);
    (offsets || measured || b.window || padded.iter().any(Option::is_some)).then_some(b)
}

/// Most programs `sweep` builds for one structure (two changing sizes up to
/// 512 would make 100).
const SWEEP: usize = 64;

/// The programs of every bucket up to `up_to` of each changing size of the
/// structures fitted so far, built from the graph each fit was made on,
/// with parameters padded as they were then.
fn sweep(up_to: i64) -> Vec<Graph> {
    let families: Vec<(Arc<Fit>, Arc<Seen>)> = FAMILIES
        .lock()
        .unwrap()
        .iter()
        .flat_map(|f| f.values())
        .filter_map(|f| Some((f.fit.clone()?, f.seen.clone()?)))
        .collect();
    let mut buckets = vec![bucket(1)];
    while *buckets.last().unwrap() < up_to {
        buckets.push(bucket(buckets.last().unwrap() + 1));
    }
    let mut graphs = Vec::new();
    for (fit, seen) in families {
        let at = |buckets: &[i64]| Builder::new(&seen.graph, &seen.slots, &fit.formulas, buckets);
        let met: Vec<i64> = fit.sizes(&seen.ints).iter().map(|&s| bucket(s)).collect();
        // How much larger than its bounds each padded parameter came.
        let excess: Vec<Option<Vec<i64>>> = (seen.padded.iter().zip(at(&met).param_bounds()))
            .map(|(p, b)| {
                let p = p.as_ref().filter(|p| p.len() == b.len() && p.iter().zip(&b).all(|(x, y)| x >= y))?;
                Some(p.iter().zip(&b).map(|(x, y)| x - y).collect())
            })
            .collect();
        let mut combos: Vec<Vec<i64>> = vec![Vec::new()];
        for _ in &fit.sizes {
            combos = combos.iter().flat_map(|c| buckets.iter().map(move |&b| [c.as_slice(), &[b]].concat())).collect();
        }
        combos.sort_by_key(|c| c.iter().product::<i64>()); // the smallest first, where `SWEEP` cuts
        for buckets in combos.into_iter().take(SWEEP) {
            let builder = at(&buckets);
            let padded: Vec<Option<Vec<i64>>> = (excess.iter().zip(builder.param_bounds()))
                .map(|(e, b)| e.as_ref().map(|e| e.iter().zip(&b).map(|(x, y)| x + y).collect()))
                .collect();
            let padded: Vec<Option<&[i64]>> = padded.iter().map(Option::as_deref).collect();
            graphs.extend(builder.build(&padded, &[]).map(|b| b.graph));
        }
    }
    graphs
}

/// Compiles (into the persistent cache) the programs of every bucket up to
/// `up_to` of the changing sizes met so far, on `threads` threads; returns
/// how many programs there are. A bucket XLA cannot compile is left out, as
/// it would be when met.
pub fn warm(up_to: i64, threads: usize) -> usize {
    let graphs = Mutex::new(sweep(up_to));
    let count = graphs.lock().unwrap().len();
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| {
                while let Some(g) = graphs.lock().unwrap().pop() {
                    let _ = cache::compile(&g, "bucketed fused program");
                }
            });
        }
    });
    count
}

fn refuse(why: &str) -> Option<Bucketed> {
    refused(why);
    None
}

/// Counts a trace left static, and why.
pub fn refused(why: &str) {
    if crate::exec::trace::logging() {
        eprintln!("torchtpu: a changing size not bucketed: {why}");
    }
    *METRICS.bucket_refusals.lock().unwrap().entry(why.to_string()).or_insert(0) += 1;
}

struct Builder<'a> {
    g: &'a Graph,
    out: Graph,
    /// Per node: each dimension's formula; a const's value, a slice's fields.
    dims: Vec<Vec<Formula>>,
    value: FxMap<V, Formula>,
    slice: FxMap<(V, usize, usize), Formula>,
    pad: FxMap<(V, usize, usize), Formula>,
    /// The changing sizes' parameters and buckets.
    sizes: Vec<V>,
    buckets: Vec<i64>,
    computed: FxMap<Formula, V>,
}

fn dynamic(forms: &[Formula]) -> u64 {
    forms.iter().enumerate().filter(|(_, f)| f.changes()).fold(0, |m, (d, _)| m | 1 << d)
}

impl<'a> Builder<'a> {
    fn new(g: &'a Graph, slots: &[Slot], formulas: &[Formula], buckets: &[i64]) -> Builder<'a> {
        let mut dims: Vec<Vec<Formula>> = g.nodes.iter().map(|n| vec![Formula::default(); n.ty.rank()]).collect();
        let (mut value, mut slice, mut pad) = (FxMap::default(), FxMap::default(), FxMap::default());
        for (slot, &f) in slots.iter().zip(formulas) {
            match *slot {
                Slot::Dim(v, d) => dims[v][d] = f,
                Slot::Const(v) => drop(value.insert(v, f)),
                Slot::Slice(v, field, d) => drop(slice.insert((v, field, d), f)),
                Slot::Pad(v, field, d) => drop(pad.insert((v, field, d), f)),
            }
        }
        let mut out = Graph::default();
        for ty in &g.params {
            out.param(Ty::new(ty.dtype, &ty.shape)); // shapes fixed in `build`
        }
        let sizes = buckets.iter().map(|_| out.param(Ty::new(DType::I32, &[]))).collect();
        Builder { g, out, dims, value, slice, pad, sizes, buckets: buckets.to_vec(), computed: FxMap::default() }
    }

    /// Each parameter's bounds.
    fn param_bounds(&self) -> Vec<Vec<i64>> {
        let mut bounds = vec![Vec::new(); self.g.params.len()];
        for (v, node) in self.g.nodes.iter().enumerate() {
            if let Op::Param(n) = node.op {
                bounds[n] = self.ty(v, 0).shape;
            }
        }
        bounds
    }

    fn bound(&self, f: Formula) -> i64 {
        f.bound(&self.buckets)
    }

    /// Node `v`'s type with its bounds; `dynamic` marks which dimensions are.
    fn ty(&self, v: V, dynamic: u64) -> Ty {
        let ty = &self.g.nodes[v].ty;
        let shape: Vec<i64> = self.dims[v].iter().map(|&f| self.bound(f)).collect();
        Ty { dtype: ty.dtype, shape, dynamic }
    }

    /// An i32 scalar constant.
    fn int(&mut self, x: i64) -> V {
        self.out.push(Op::Const(x), vec![], Ty::new(DType::I32, &[]))
    }

    /// A formula's value as an i32 scalar computed from the sizes.
    fn size(&mut self, f: Formula) -> V {
        if let Some(&v) = self.computed.get(&f) {
            return v;
        }
        let mut sum = None;
        for (k, &c) in f.0.iter().enumerate().skip(1).filter(|(_, &c)| c != 0) {
            let (first, rest) = term_sizes(k).split_first().expect("a size for each term but the constant");
            let mut term = self.sizes[*first];
            for &i in rest {
                term = self.out.binary("stablehlo.multiply", term, self.sizes[i]);
            }
            if c != 1 {
                let c = self.int(c);
                term = self.out.binary("stablehlo.multiply", term, c);
            }
            sum = Some(match sum {
                Some(acc) => self.out.binary("stablehlo.add", acc, term),
                None => term,
            });
        }
        let v = match sum {
            None => self.int(f.0[0]),
            Some(acc) if f.0[0] != 0 => {
                let c = self.int(f.0[0]);
                self.out.binary("stablehlo.add", acc, c)
            }
            Some(acc) => acc,
        };
        self.computed.insert(f, v);
        v
    }

    /// `x` (node `v`'s value) with its dimensions in `mask` set to their real sizes.
    fn set_sizes(&mut self, mut x: V, v: V, mask: u64) -> V {
        for d in 0..self.dims[v].len() {
            if mask >> d & 1 == 1 {
                let size = self.size(self.dims[v][d]);
                let mut ty = self.out.ty(x).clone();
                ty.dynamic |= 1 << d;
                x = self.out.push(Op::SetDimensionSize(d as i64), vec![x, size], ty);
            }
        }
        x
    }

    /// Node `v`, a pad whose high padding changes with the sizes (to a
    /// length that grows with them, or a tail `x[n:]` padded back to its
    /// storage's length), of static arrays: padded to the result's bounds,
    /// the operand's own padding past its real elements replaced by the pad
    /// value, the real sizes set after. A moving low padding or interior is
    /// refused (no lowering makes one).
    fn pad_to_size(&mut self, v: V, low: &[i64], interior: &[i64], args: Vec<V>, want: u64) -> Option<V> {
        let operand = self.g.nodes[v].args[0];
        let (bounds, operand_bounds) = (self.ty(v, 0).shape, self.ty(operand, 0).shape);
        let changing: Vec<usize> = (0..low.len()).filter(|&d| self.dims[operand][d].changes()).collect();
        let mut high = Vec::with_capacity(low.len());
        for d in 0..low.len() {
            let [fl, fh, fi] = [0, 1, 2].map(|f| self.pad[&(v, f, d)]);
            let moved = fh.changes() || changing.contains(&d);
            if fl.changes() || fi.changes() || (moved && (low[d] < 0 || interior[d] != 0)) {
                return None;
            }
            // Negative where the operand's bounds pass the result's (a tail
            // `x[n:]` of a fixed storage, bounded at the smallest n): only
            // its padding is cut.
            let spread = operand_bounds[d] + interior[d] * (operand_bounds[d] - 1).max(0);
            high.push(bounds[d] - low[d] - spread);
        }
        let (x, value) = (self.static_(args[0]), args[1]);
        let mut x = self.out.pad(x, value, low, &high, interior);
        let fill = self.out.broadcast_in_dim(value, &bounds, &[]);
        for d in changing {
            let iota = self.out.iota(DType::I32, &bounds, d);
            let real = self.size(self.dims[operand][d]);
            let end = self.int(low[d]);
            let end = self.out.binary("stablehlo.add", real, end);
            let end = self.out.broadcast_in_dim(end, &bounds, &[]);
            let inside = self.out.compare("LT", iota, end);
            x = self.out.select(inside, x, fill);
        }
        Some(self.set_sizes(x, v, want))
    }

    /// A slice of node `v`'s operand: static where its bounds stay put, else
    /// of the bound of its size at an end that moves no faster than the
    /// operand's, or at a start computed from `s` (only real elements read).
    fn slice(&mut self, v: V, start: &[i64], limit: &[i64], stride: &[i64], mut args: Vec<V>) -> Option<V> {
        let operand = self.g.nodes[v].args[0];
        args[0] = self.static_(args[0]);
        let (mut limit, mut starts, mut moving) = (limit.to_vec(), Vec::new(), false);
        let mut room = vec![0; limit.len()];
        for d in 0..limit.len() {
            let [fs, fl, ft] = [0, 1, 2].map(|f| self.slice[&(v, f, d)]);
            let (od, size) = (self.dims[operand][d], self.dims[v][d]);
            if ft.changes() || (stride[d] != 1 && (fs.changes() || fl.changes())) {
                return None;
            }
            // The real start and limit fit the operand (the trace was built
            // from them); a bucket's bounds must fit too where a size changes.
            // A window whose bound passes the operand's end (XLA would clamp
            // a moving start; a static limit would not fit) gets room after
            // the operand: a tail of a fixed budget, `x[n:]`, bounded at the
            // smallest n; a prefix `x[:n]` whose bucket passes a fixed size.
            let sized = size.changes() || od.changes();
            if fs.changes() {
                moving = true;
                if sized {
                    room[d] = (self.bound(fs) + self.bound(size) - self.bound(od)).max(0);
                }
            } else if fl.changes() {
                room[d] = (self.bound(fl) - self.bound(od)).max(0);
            }
            limit[d] = self.bound(fl);
            starts.push(fs);
        }
        if room.iter().any(|&r| r > 0) {
            let dtype = self.out.ty(args[0]).dtype;
            let zero = self.out.full(0.0, dtype, &[]);
            let low = vec![0; room.len()];
            args[0] = self.out.pad(args[0], zero, &low, &room, &low);
        }
        if !moving {
            let op = Op::Slice { start: start.to_vec(), limit, stride: stride.to_vec() };
            return Some(self.out.push(op, args, self.ty(v, 0)));
        }
        let mut operands = args;
        for f in starts {
            operands.push(self.size(f));
        }
        let sizes = self.dims[v].iter().map(|&f| self.bound(f)).collect();
        Some(self.out.push(Op::DynamicSlice(sizes), operands, self.ty(v, 0)))
    }

    /// Node `v`, a reshape of `x`, as a static array (StableHLO's reshape
    /// takes one bounded dimension at most; the caller sets the sizes): of
    /// the padded layout where it is the result's, else (a flat storage
    /// viewed as rows of a changing length, two changing sizes merged) each
    /// element gathered from the operand's padded layout at the index of the
    /// same position in row-major order of the real sizes.
    fn reshape(&mut self, v: V, x: V) -> V {
        let operand = self.g.nodes[v].args[0];
        let bounds = self.ty(v, 0);
        let x = self.static_(x);
        // Bounds of a size that shrinks are taken where it is largest, so a
        // product's bound may differ from its factors' (then gathered too).
        let layout = self.ty(operand, 0).shape;
        if self.keeps_layout(operand, v) && layout.iter().product::<i64>() == bounds.numel() {
            return self.out.push(Op::Reshape, vec![x], bounds);
        }
        let (from, to) = (self.dims[operand].clone(), self.dims[v].clone());
        let flat = self.out.reshape(x, &[layout.iter().product()]);
        let positions = Ty::new(DType::I32, &bounds.shape);
        let mut at = self.out.full(0.0, DType::I32, &bounds.shape);
        let mut stride = self.int(1);
        for e in (0..to.len()).rev() {
            let iota = self.out.push(Op::Iota(e as i64), vec![], positions.clone());
            let term = self.by_scalar("stablehlo.multiply", iota, stride);
            at = self.out.binary("stablehlo.add", at, term);
            let size = self.size(to[e]);
            stride = self.out.binary("stablehlo.multiply", stride, size);
        }
        let mut index = self.out.full(0.0, DType::I32, &bounds.shape);
        let (mut stride, mut step) = (self.int(1), 1);
        for d in (0..from.len()).rev() {
            let size = self.size(from[d]);
            let mut i = self.by_scalar("stablehlo.divide", at, stride);
            if d > 0 {
                i = self.by_scalar("stablehlo.remainder", i, size);
            }
            let step_v = self.int(step);
            let term = self.by_scalar("stablehlo.multiply", i, step_v);
            index = self.out.binary("stablehlo.add", index, term);
            stride = self.out.binary("stablehlo.multiply", stride, size);
            step *= layout[d];
        }
        self.out.take(flat, index, 0)
    }

    /// `a name b` for an i32 index array `a` and an i32 scalar `b`.
    fn by_scalar(&mut self, name: &'static str, a: V, b: V) -> V {
        let shape = self.out.ty(a).shape.clone();
        let b = self.out.broadcast_in_dim(b, &shape, &[]);
        self.out.binary(name, a, b)
    }

    /// Whether `operand`'s padded layout reshapes as a static array into
    /// `v`'s: in PyTorch's order, each group of dimensions (equal products,
    /// ignoring dimensions of size 1) holding a changing dimension holds one
    /// on each side, the major one of the group there (a merge or split
    /// around it). (XLA's own reshape of a bounded dimension compacts the
    /// real elements with a sort, which cost more than the rest of a
    /// decoding step.)
    fn keeps_layout(&self, operand: V, v: V) -> bool {
        let sized = |u: V| -> Vec<(i64, Formula)> {
            let dims = &self.dims[u];
            let shape = &self.g.nodes[u].ty.shape;
            (0..shape.len()).filter(|&d| shape[d] != 1 || dims[d].changes()).map(|d| (shape[d], dims[d])).collect()
        };
        let (from, to) = (sized(operand), sized(v));
        let (mut i, mut j) = (0, 0);
        while i < from.len() && j < to.len() {
            let (i0, j0) = (i, j);
            let (mut pf, mut pt) = (from[i].0, to[j].0);
            while pf != pt {
                if pf < pt {
                    i += 1;
                    pf *= from.get(i).map_or(0, |f| f.0);
                } else {
                    j += 1;
                    pt *= to.get(j).map_or(0, |t| t.0);
                }
                if i >= from.len() || j >= to.len() {
                    return false;
                }
            }
            let changing =
                |side: &[(i64, Formula)], a: usize, b: usize| (a..=b).filter(|&k| side[k].1.changes()).count();
            let (cf, ct) = (changing(&from, i0, i), changing(&to, j0, j));
            let major = cf == 1 && ct == 1 && from[i0].1.changes() && to[j0].1.changes();
            if cf + ct > 0 && !major {
                return false;
            }
            i += 1;
            j += 1;
        }
        i == from.len() && j == to.len()
    }

    /// `x` with its bounded dimensions static again (a constant size equal to
    /// the bound; the padding read as it is): a program's outputs, and what
    /// slices and gathers take, which read real elements only. XLA would carry
    /// a bounded operand's size into their results, past a result's bound
    /// where they cut the dimension (a heap overrun).
    fn static_(&mut self, mut x: V) -> V {
        let ty = self.out.ty(x).clone();
        for d in (0..ty.rank()).filter(|d| ty.dynamic >> d & 1 == 1) {
            let bound = self.int(ty.shape[d]);
            let mut t = self.out.ty(x).clone();
            t.dynamic &= !(1 << d);
            x = self.out.push(Op::SetDimensionSize(d as i64), vec![x, bound], t);
        }
        x
    }

    /// Node `v`, a sort, of static arrays: along a changing size, a first
    /// key puts the padding after the real elements (a stable sort keeps
    /// their order otherwise); along a fixed one, padded rows sort among
    /// themselves.
    fn sort(&mut self, v: V, args: Vec<V>, dim: i64, descending: bool, keys: usize, result: usize) -> V {
        let mut operands: Vec<V> = args.into_iter().map(|a| self.static_(a)).collect();
        let (mut keys, mut result) = (keys, result);
        let size = self.dims[v][dim as usize];
        let bounds = self.ty(v, 0);
        if size.changes() {
            let iota = self.out.iota(DType::I32, &bounds.shape, dim as usize);
            let n = self.size(size);
            let n = self.out.broadcast_in_dim(n, &bounds.shape, &[]);
            // Real elements: false ascending (before true), true descending.
            let key = self.out.compare(if descending { "LT" } else { "GE" }, iota, n);
            operands.insert(0, key);
            (keys, result) = (keys + 1, result + 1);
        }
        self.out.push(Op::Sort { dim, descending, keys, result }, operands, bounds)
    }

    /// Node `v`, a concatenation. XLA lays the real elements out one after
    /// another in the sum of the operands' bounds; where a size that shrinks
    /// makes the result's bound smaller than that sum (what is left of a
    /// fixed budget joined to what was taken), the result is cut to it.
    fn concatenate(&mut self, v: V, args: Vec<V>, axis: usize, want: u64) -> V {
        let args = self.bounded_operands(args, axis);
        let ty = self.ty(v, want);
        let sum: i64 = args.iter().map(|&a| self.out.ty(a).shape[axis]).sum();
        // Bounded operands make a bounded result, whatever its real size:
        // one of fixed size (a window written into a tensor) is made static.
        let mut wide = ty.clone();
        wide.shape[axis] = sum;
        wide.dynamic |= args.iter().fold(0, |m, &a| m | self.out.ty(a).dynamic) & 1 << axis;
        if wide == ty {
            return self.out.push(Op::Concatenate(axis as i64), args, ty);
        }
        let x = self.out.push(Op::Concatenate(axis as i64), args, wide);
        let mut x = self.static_(x);
        if sum != ty.shape[axis] {
            x = self.out.slice_dim(x, axis, 0, ty.shape[axis], 1);
        }
        self.set_sizes(x, v, want)
    }

    /// A concatenation's operands, each with a bounded type if any is: the
    /// StableHLO verifier aborts the process on a static first operand
    /// followed by a bounded one. A static operand gets its own size.
    fn bounded_operands(&mut self, args: Vec<V>, axis: usize) -> Vec<V> {
        if args.iter().all(|&a| self.out.ty(a).dynamic == 0) {
            return args;
        }
        args.into_iter()
            .map(|a| {
                let ty = self.out.ty(a).clone();
                if ty.dynamic != 0 {
                    return a;
                }
                let size = self.int(ty.shape[axis]);
                let bounded = Ty { dynamic: 1 << axis, ..ty };
                self.out.push(Op::SetDimensionSize(axis as i64), vec![a, size], bounded)
            })
            .collect()
    }

    /// `copied[n]`: the shape a program of these buckets took parameter `n`
    /// in where it was padded, for an input that must be copied anyway (it
    /// comes unpadded, or smaller than its bounds): so that which earlier
    /// program made an input (the trace's own, another bucket's) does not
    /// make another program of this bucket.
    fn build(mut self, padded: &[Option<&[i64]>], copied: &[Option<Vec<i64>>]) -> Option<Bucketed> {
        let g = self.g;
        let mut map: Vec<V> = Vec::with_capacity(g.nodes.len());
        for (v, node) in g.nodes.iter().enumerate() {
            let want = dynamic(&self.dims[v]);
            let args: Vec<V> = node.args.iter().map(|&a| map[a]).collect();
            let any = want != 0 || node.args.iter().any(|&a| dynamic(&self.dims[a]) != 0);
            let x = match &node.op {
                &Op::Param(n) => {
                    // A padded buffer at least as large as the bounds is taken
                    // as it is and cut. Others are copied into `copied[n]`
                    // where a program of these buckets took one, else into
                    // the bounds of a size one larger: what a value that grows
                    // by one each step (a KV cache) leaves its bucketed
                    // program, so that its first and later steps share one.
                    let bounds = self.ty(v, 0);
                    let larger = |shape: &[i64]| {
                        shape.len() == bounds.rank() && shape.iter().zip(&bounds.shape).all(|(a, b)| a >= b)
                    };
                    let next: Vec<i64> = self.buckets.iter().map(|b| b + 1).collect();
                    let grown: Vec<i64> = self.dims[v].iter().map(|f| f.bound(&next)).collect();
                    let shape = match padded[n] {
                        Some(shape) if larger(shape) => shape,
                        _ => copied.get(n).and_then(Option::as_deref).filter(|&c| larger(c)).unwrap_or(&grown),
                    };
                    let ty = Ty::new(bounds.dtype, shape);
                    let cut = ty.shape != bounds.shape;
                    self.out.params[n] = ty.clone();
                    self.out.nodes[n].ty = ty;
                    let mut x = n;
                    if cut {
                        let (start, stride) = (vec![0; bounds.rank()], vec![1; bounds.rank()]);
                        let op = Op::Slice { start, limit: bounds.shape.clone(), stride };
                        x = self.out.push(op, vec![n], bounds);
                    }
                    self.set_sizes(x, v, want)
                }
                &Op::Const(bits) => {
                    let c = match self.value.get(&v).copied().filter(Formula::changes) {
                        // A count (a mean's, a loss's): computed from `s`.
                        Some(f) => {
                            let n = self.size(f);
                            let scalar = Ty::new(node.ty.dtype, &[]);
                            let n = self.out.push(Op::Convert, vec![n], scalar);
                            self.out.push(Op::BroadcastInDim(vec![]), vec![n], self.ty(v, 0))
                        }
                        None => self.out.push(Op::Const(bits), vec![], self.ty(v, 0)),
                    };
                    self.set_sizes(c, v, want)
                }
                Op::Iota(_) | Op::Dense(_) => {
                    let x = self.out.push(node.op.clone(), vec![], self.ty(v, 0));
                    self.set_sizes(x, v, want)
                }
                // Broadcast as static arrays (StableHLO's broadcast takes
                // one bounded dimension at most), the padding with the rest.
                Op::BroadcastInDim(_) => {
                    let x = self.static_(args[0]);
                    let x = self.out.push(node.op.clone(), vec![x], self.ty(v, 0));
                    self.set_sizes(x, v, want)
                }
                Op::Slice { start, limit, stride } => match self.slice(v, start, limit, stride, args) {
                    Some(x) => self.set_sizes(x, v, want),
                    None => return refuse("a slice at an offset that changes"),
                },
                Op::Reshape => {
                    let x = self.reshape(v, args[0]);
                    self.set_sizes(x, v, want)
                }
                // `x == x` of integers along a changing size: XLA folds it
                // into a constant of the bounded shape and aborts the process
                // (a median's NaN count); the same constant, sized here.
                Op::Compare(_) if node.args[0] == node.args[1] && !g.ty(node.args[0]).dtype.has_float_values() => {
                    let same = matches!(node.op, Op::Compare("EQ" | "LE" | "GE"));
                    let x = self.out.push(Op::Const(same as i64), vec![], self.ty(v, 0));
                    self.set_sizes(x, v, want)
                }
                Op::Elementwise(_)
                | Op::Compare(_)
                | Op::Select
                | Op::Convert
                | Op::Transpose(_)
                | Op::Reduce { .. }
                | Op::DotGeneral { .. } => self.out.push(node.op.clone(), args, self.ty(v, want)),
                Op::BitcastConvert if node.ty.rank() == g.ty(node.args[0]).rank() => {
                    self.out.push(node.op.clone(), args, self.ty(v, want))
                }
                &Op::Concatenate(axis) => self.concatenate(v, args, axis as usize, want),
                Op::Pad { low, interior, .. }
                    if (0..low.len()).any(|d| (0..3).any(|f| self.pad[&(v, f, d)].changes())) =>
                {
                    match self.pad_to_size(v, low, interior, args, want) {
                        Some(x) => x,
                        None => return refuse(&why_not(&node.op)),
                    }
                }
                // Padding goes right after the real elements (checked).
                Op::Pad { low, high, interior }
                    if (0..low.len())
                        .all(|d| !self.dims[v][d].changes() || (low[d] >= 0 && high[d] >= 0 && interior[d] == 0)) =>
                {
                    self.out.push(node.op.clone(), args, self.ty(v, want))
                }
                Op::ArgReduce { .. } => self.out.push(node.op.clone(), args, self.ty(v, want)),
                // A variadic reduction's further results, as its first.
                Op::Result(_) if matches!(g.nodes[node.args[0]].op, Op::Reduce { .. }) => {
                    self.out.push(node.op.clone(), args, self.ty(v, want))
                }
                &Op::Sort { dim, descending, keys, result } => {
                    let x = self.sort(v, args, dim, descending, keys, result);
                    self.set_sizes(x, v, want)
                }
                // Indices within the real size are the lowerings' to check
                // (against a count computed from `s`), as without padding.
                Op::Take { .. } => {
                    let args = vec![self.static_(args[0]), args[1]];
                    let x = self.out.push(node.op.clone(), args, self.ty(v, 0));
                    self.set_sizes(x, v, want)
                }
                // XLA drops the padding's updates (checked). A target that
                // changes along the axis is taken as its static array:
                // indices within the real size (the lowerings' checks) leave
                // its padding alone.
                &Op::Put { axis, .. } if self.dims[node.args[0]][axis as usize].changes() => {
                    let args = vec![self.static_(args[0]), args[1], args[2]];
                    let x = self.out.push(node.op.clone(), args, self.ty(v, 0));
                    self.set_sizes(x, v, want)
                }
                Op::Put { .. } => self.out.push(node.op.clone(), args, self.ty(v, want)),
                // XLA's threefry draws element i from counter i in row-major
                // order: drawn for the bounds, the real elements are those
                // of the draw of the real size where only the leading
                // dimension changes (a `randperm` of a count).
                Op::RngBits if want & !1 == 0 => {
                    let x = self.out.push(Op::RngBits, args, self.ty(v, 0));
                    self.set_sizes(x, v, want)
                }
                op if !any => self.out.push(op.clone(), args, node.ty.clone()),
                op => return refuse(&why_not(op)),
            };
            map.push(x);
        }
        // Outputs leave static, padded.
        let mut padded = Vec::with_capacity(g.outputs.len());
        for &o in &g.outputs {
            let x = self.static_(map[o]);
            padded.push((dynamic(&self.dims[o]) != 0).then(|| self.out.ty(x).shape.clone()));
            self.out.outputs.push(x);
        }
        let types_match = |out: &Graph, k: usize, o: usize| out.params[k] == *out.ty(out.outputs[o]);
        self.out.donors =
            g.donors.iter().enumerate().map(|(k, d)| d.filter(|&o| types_match(&self.out, k, o))).collect();
        self.out.donors.extend(self.sizes.iter().map(|_| None));
        let window =
            self.slice.iter().any(|(&(v, _, d), f)| f.changes() && !self.dims[g.nodes[v].args[0]][d].changes());
        Some(Bucketed { graph: self.out, sizes: Vec::new(), buckets: self.buckets, padded, window })
    }
}

/// Why a changing dimension cannot reach `op`.
fn why_not(op: &Op) -> String {
    match op {
        Op::Pad { .. } => "a pad of a changing size".into(),
        Op::Reverse(_) => "a reverse along a changing size".into(),
        Op::Convolution(..) => "a convolution over a changing size".into(),
        // The variant's name only: its fields may hold a constant's data.
        _ => {
            let name = format!("{op:?}");
            let end = name.find(|c: char| !c.is_alphanumeric()).unwrap_or(name.len());
            format!("an op without bounded dimensions: {}", &name[..end])
        }
    }
}

/// The elements of the box `real` of a row-major array shaped `from`, laid
/// out in an array shaped `to` (zeros elsewhere); `size` bytes per element.
fn copy_box(src: &[u8], from: &[i64], to: &[i64], real: &[i64], size: usize) -> Vec<u8> {
    let mut out = vec![0u8; to.iter().product::<i64>() as usize * size];
    let strides = |shape: &[i64]| {
        let mut s = vec![size; shape.len()];
        for d in (0..shape.len().saturating_sub(1)).rev() {
            s[d] = s[d + 1] * shape[d + 1] as usize;
        }
        s
    };
    let (sf, st) = (strides(from), strides(to));
    let rank = real.len();
    if rank == 0 || real.contains(&0) {
        out[..src.len().min(size)].copy_from_slice(&src[..src.len().min(size)]);
        return out;
    }
    let row = real[rank - 1] as usize * size;
    let mut index = vec![0i64; rank - 1];
    loop {
        let (a, b) =
            index.iter().enumerate().fold((0, 0), |(a, b), (d, &i)| (a + i as usize * sf[d], b + i as usize * st[d]));
        out[b..b + row].copy_from_slice(&src[a..a + row]);
        let Some(d) = (0..rank - 1).rev().find(|&d| index[d] + 1 < real[d]) else { break };
        index[d] += 1;
        index[d + 1..].iter_mut().for_each(|i| *i = 0);
    }
    out
}

/// `buf`'s contents in a buffer shaped `shape` (None: exactly its type's).
fn reshaped(buf: &Arc<DeviceBuffer>, shape: Option<&[i64]>) -> Result<Arc<DeviceBuffer>> {
    let size = buf.ty.dtype.size();
    let mut bytes = vec![0u8; buf.shape().iter().product::<i64>() as usize * size];
    buf.to_host(&mut bytes)?;
    bump(&METRICS.transfers_to_host);
    let to = shape.unwrap_or(&buf.ty.shape);
    let bytes = copy_box(&bytes, buf.shape(), to, &buf.ty.shape, size);
    let rt = runtime::get()?;
    let raw = rt.client.buffer_from_host(&bytes, buf.ty.dtype.element_type(), to, rt.device(buf.device)?)?;
    bump(&METRICS.transfers_to_device);
    let padded = (to != buf.ty.shape.as_slice()).then(|| to.to_vec());
    Ok(DeviceBuffer::with_shape(raw, buf.ty.clone(), padded, buf.device))
}

/// `buf` holding exactly its type's elements: a padded buffer's box,
/// copied through the host, for readers other than bucketed programs.
pub fn unpad(buf: &Arc<DeviceBuffer>) -> Result<Arc<DeviceBuffer>> {
    if buf.padded.is_none() {
        return Ok(buf.clone());
    }
    bump(&METRICS.unpads);
    reshaped(buf, None)
}

/// `buf` in a buffer shaped `shape`, as a bucketed program's parameter.
pub fn repad(buf: &Arc<DeviceBuffer>, shape: &[i64]) -> Result<Arc<DeviceBuffer>> {
    if buf.shape() == shape {
        return Ok(buf.clone());
    }
    bump(&METRICS.repads);
    reshaped(buf, Some(shape))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Samples of integers computed from the sizes by `f`.
    fn samples(sizes: &[&[i64]], f: impl Fn(&[i64]) -> Vec<i64>) -> Vec<Vec<i64>> {
        sizes.iter().map(|s| f(s)).collect()
    }

    fn holds(fit: &Fit, sizes: &[&[i64]], f: impl Fn(&[i64]) -> Vec<i64>) -> bool {
        sizes.iter().all(|s| fit.holds(&f(s)))
    }

    #[test]
    fn one_size_fits_from_two_samples() {
        let f = |s: &[i64]| vec![s[0], 4 * s[0], 7, 240 - s[0]];
        let fit = fit(&samples(&[&[3], &[9]], f)).unwrap();
        assert_eq!(fit.sizes, vec![0]);
        assert!(holds(&fit, &[&[1], &[100]], f));
    }

    #[test]
    fn two_sizes_fit_affine_from_three_samples_and_with_their_product_from_four() {
        let sum = |s: &[i64]| vec![s[0], s[1] + 5, s[0] + s[1], 2 * s[0] + 3];
        let fit3 = fit(&samples(&[&[3, 40], &[9, 41], &[4, 60]], sum)).unwrap();
        assert!(holds(&fit3, &[&[17, 2], &[1, 1]], sum));
        let product = |s: &[i64]| vec![s[0], s[1], s[0] * s[1], s[0] * s[1] * 16 + s[0]];
        let few = samples(&[&[3, 40], &[9, 41], &[4, 60]], product);
        assert!(fit(&few).is_err());
        let fit4 = fit(&samples(&[&[3, 40], &[9, 41], &[4, 60], &[5, 5]], product)).unwrap();
        assert!(holds(&fit4, &[&[17, 2], &[64, 128]], product));
    }

    #[test]
    fn three_sizes_fit_affine_a_budget_and_what_it_leaves() {
        // Per-image counts kept, and what a budget of 512 leaves of the first.
        let f = |s: &[i64]| vec![s[0], s[1], s[2], s[0] + s[1], 512 - s[0], s[0] + s[1] + s[2]];
        let sizes: &[&[i64]] = &[&[30, 700, 5], &[31, 650, 9], &[12, 701, 3], &[40, 720, 1]];
        assert!(fit(&samples(&sizes[..3], f)).is_err(), "three samples cannot show three sizes");
        let fit = fit(&samples(sizes, f)).unwrap();
        assert_eq!(fit.sizes.len(), 3);
        assert!(holds(&fit, &[&[64, 1000, 64], &[1, 1, 1]], f));
    }

    #[test]
    fn a_bound_is_the_largest_value_over_the_box_of_buckets() {
        let mut c = [0; TERMS];
        (c[0], c[1], c[4]) = (512, -1, 2); // 512 - s0 + 2 * s2
        assert_eq!(Formula(c).bound(&[64, 8, 16]), 512 - 1 + 32);
    }

    #[test]
    fn a_count_known_to_change_is_a_size_before_it_changes() {
        // A count of positives (slot 1, 6 in every sample) and what a
        // proposal count (slot 0) leaves of it; slot 3 is a constant 6 of
        // the same value but a known count only at slot 1.
        let f = |s: &[i64]| vec![s[0], s[1], s[0] - s[1], 6, 4 * s[1] + 1];
        let seen = samples(&[&[260, 6], &[257, 6], &[263, 6]], f);
        let fit = fit_counts(&seen, &[1]).unwrap();
        assert_eq!(fit.sizes, vec![0, 1]);
        assert!(holds(&fit, &[&[259, 7], &[300, 2]], |s| vec![s[0], s[1], s[0] - s[1], s[1], 25]));
        assert!(!holds(&fit, &[&[259, 7]], f), "6 is taken for the count, a guess a new fit mends");
    }

    #[test]
    fn sizes_hovering_at_an_edge_take_the_bucket_above() {
        let met = |b: &[i64]| Met { buckets: b.to_vec(), params: None };
        assert_eq!(buckets_for(&[], &[256, 20], &[]), vec![256, 32]);
        assert_eq!(buckets_for(&[], &[256, 20], &[vec![262, 21]]), vec![512, 32]);
        assert_eq!(buckets_for(&[], &[250, 20], &[vec![400, 21]]), vec![256, 32], "not hovering");
        assert_eq!(buckets_for(&[met(&[512, 32])], &[200, 20], &[]), vec![512, 32], "the bucket above, met");
        assert_eq!(buckets_for(&[met(&[512, 32])], &[100, 20], &[]), vec![128, 32]);
    }

    #[test]
    fn fits_survive_the_persistent_cache() {
        let f = |s: &[i64]| vec![s[0], s[1], s[2], s[0] + s[1] + s[2]];
        let fit = fit(&samples(&[&[1, 5, 9], &[2, 5, 9], &[2, 7, 9], &[2, 7, 12]], f)).unwrap();
        let back = Fit::from_bytes(&fit.to_bytes()).unwrap();
        assert_eq!((back.sizes, back.formulas), (fit.sizes, fit.formulas));
    }
}
