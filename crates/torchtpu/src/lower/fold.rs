//! Sliding blocks: `im2col` (`F.unfold`) gathers each kernel offset's
//! strided slice of the padded image, as pooling reads its windows;
//! `col2im` (`F.fold`), its transpose, adds them back in kernel-offset
//! order, the order of CPU's loop. Each is the other's gradient.
use super::elementwise::not_implemented;
use super::pool::{add_windows, windows, Window};
use super::{op, Cx, Entry};
use crate::ensure;
use crate::error::Result;
use crate::ir::dtype::DType;
use crate::ir::V;
use crate::lower::args::Tensor;

pub static ENTRIES: &[Entry] = &[op("im2col", im2col), op("col2im", col2im)];

/// kernel, dilation, padding, stride: (height, width) each.
struct Blocks {
    kernel: [i64; 2],
    dilation: [i64; 2],
    pad: [i64; 2],
    stride: [i64; 2],
}

impl Blocks {
    /// The arguments, with the checks both operators share, in CPU's order.
    fn of(cx: &Cx, stride_first: bool) -> Result<Blocks> {
        let pair = |name: &str| -> Result<[i64; 2]> {
            let v = cx.ints(name)?;
            ensure!(v.len() == 2, "It is expected {name} equals to 2, but got size {}", v.len());
            Ok([v[0], v[1]])
        };
        let b = Blocks {
            kernel: pair("kernel_size")?,
            dilation: pair("dilation")?,
            pad: pair("padding")?,
            stride: pair("stride")?,
        };
        let [kh, kw] = b.kernel;
        ensure!(
            kw > 0 && kh > 0,
            "kernel size should be greater than zero, but got kernel_height: {kh} kernel_width: {kw}"
        );
        let stride = || -> Result<()> {
            let [sh, sw] = b.stride;
            ensure!(
                sw > 0 && sh > 0,
                "stride should be greater than zero, but got stride_height: {sh} stride_width: {sw}"
            );
            Ok(())
        };
        if stride_first {
            stride()?;
        }
        let [dh, dw] = b.dilation;
        ensure!(
            dw > 0 && dh > 0,
            "dilation should be greater than zero, but got dilation_height: {dh} dilation_width: {dw}"
        );
        let [ph, pw] = b.pad;
        ensure!(pw >= 0 && ph >= 0, "padding should be non-negative, but got pad_height: {ph} pad_width: {pw}");
        if !stride_first {
            stride()?;
        }
        Ok(b)
    }

    /// The number of blocks along dimension `i` of an image of `size`.
    fn count(&self, i: usize, size: i64) -> i64 {
        (size + 2 * self.pad[i] - self.dilation[i] * (self.kernel[i] - 1) - 1).div_euclid(self.stride[i]) + 1
    }

    fn window(&self, image: [i64; 2], blocks: [i64; 2]) -> Window {
        Window {
            kernel: self.kernel.to_vec(),
            stride: self.stride.to_vec(),
            pad: self.pad.to_vec(),
            dilation: self.dilation.to_vec(),
            input: image.to_vec(),
            output: blocks.to_vec(),
        }
    }

    fn describe(&self) -> String {
        let [kh, kw] = self.kernel;
        let [dh, dw] = self.dilation;
        let [ph, pw] = self.pad;
        format!("kernel_size=({kh}, {kw}), dilation=({dh}, {dw}), padding=({ph}, {pw})")
    }
}

/// CPU's kernels take floating types and bool.
fn check_dtype(t: &Tensor, kernel: &str) -> Result<()> {
    if !(t.dtype.is_float() || t.dtype == DType::Bool) {
        return Err(not_implemented(kernel, t.dtype));
    }
    Ok(())
}

/// [N, C, H, W] (or [C, H, W]) -> [N, C·kh·kw, L], L blocks in row-major
/// order, channels major to kernel offsets.
fn im2col(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let b = Blocks::of(cx, false)?;
    let s = t.sizes;
    let valid = s.len() >= 3 && s[1] != 0 && s[2] != 0;
    ensure!(
        (s.len() == 3 && s[0] != 0 && valid) || (s.len() == 4 && valid && s[3] != 0),
        "Expected 3D or 4D (batch mode) tensor with possibly 0 batch size and other non-zero dimensions for input, but got: {s:?}"
    );
    let image = [s[s.len() - 2], s[s.len() - 1]];
    let blocks = [b.count(0, image[0]), b.count(1, image[1])];
    ensure!(
        blocks[0] >= 1 && blocks[1] >= 1,
        "Given input with spatial size ({}, {}), {}, calculated shape of the array of sliding blocks as ({}, {}), but its components must be at least one.",
        image[0],
        image[1],
        b.describe(),
        blocks[0],
        blocks[1]
    );
    check_dtype(&t, "im2col_out_cpu")?;
    let lead = &s[..s.len() - 3];
    let c = s[s.len() - 3];
    let x = cx.tensor("self")?;
    // [.., C, bh, bw, k] -> [.., C, k, bh, bw]
    let stacked = windows(cx, x, &b.window(image, blocks), 0.0);
    let n = lead.len() as i64;
    let perm: Vec<i64> = (0..=n).chain([n + 3, n + 1, n + 2]).collect();
    let r = cx.g.transpose(stacked, &perm);
    let shape = [lead, &[c * b.kernel[0] * b.kernel[1], blocks[0] * blocks[1]]].concat();
    Ok(vec![cx.g.reshape(r, &shape)])
}

/// [N, C·kh·kw, L] (or unbatched) -> [N, C, H, W], overlapping blocks summed.
fn col2im(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let size = cx.ints("output_size")?;
    ensure!(size.len() == 2, "It is expected output_size equals to 2, but got size {}", size.len());
    let b = Blocks::of(cx, true)?;
    let s = t.sizes;
    ensure!(
        (s.len() == 2 && s[0] != 0 && s[1] != 0) || (s.len() == 3 && s[1] != 0 && s[2] != 0),
        "Expected 2D or 3D (batch mode) tensor for input with possibly 0 batch size and non-zero dimensions for input, but got: {s:?}"
    );
    let [kh, kw] = b.kernel;
    let planes = s[s.len() - 2];
    ensure!(
        planes % (kh * kw) == 0,
        "Expected size of input's dimension 1 to be divisible by the product of kernel_size, but got input.size(1)={planes} and kernel_size=({kh}, {kw})."
    );
    let image = [size[0], size[1]];
    let blocks = [b.count(0, image[0]), b.count(1, image[1])];
    let given = format!(
        "Given output_size=({}, {}), {}, stride=({}, {})",
        image[0],
        image[1],
        b.describe(),
        b.stride[0],
        b.stride[1]
    );
    let length = s[s.len() - 1];
    ensure!(
        length == blocks[0] * blocks[1],
        "{given}, expected size of input's dimension 2 to match the calculated number of sliding blocks {} * {} = {}, but got input.size(2)={length}.",
        blocks[0],
        blocks[1],
        blocks[0] * blocks[1]
    );
    ensure!(
        blocks[0] >= 1 && blocks[1] >= 1,
        "{given}, calculated shape of the array of sliding blocks as ({}, {}), which is too small (non-positive)",
        blocks[0],
        blocks[1]
    );
    ensure!(
        image[0] >= 1 && image[1] >= 1,
        "Expected output spatial size to be positive, but got: output_size=({}, {}).",
        image[0],
        image[1]
    );
    check_dtype(&t, "col2im_out_cpu")?;
    let lead = &s[..s.len() - 2];
    let c = planes / (kh * kw);
    let out = [lead, &[c], &image[..]].concat();
    let x = cx.tensor("self")?;
    // Bools add as integers (C++'s `bool += bool`), then test nonzero.
    let dtype = if t.dtype == DType::Bool { DType::I32 } else { t.dtype };
    let x = cx.g.convert(x, dtype);
    let x = cx.g.reshape(x, &[lead, &[c, kh * kw], &blocks[..]].concat());
    let n = lead.len();
    let part_shape = [lead, &[c], &blocks[..]].concat();
    let r = add_windows(cx, &b.window(image, blocks), &out, |cx, k| {
        let mut start = vec![0; n + 4];
        start[n + 1] = k;
        let limit = [lead, &[c, k + 1], &blocks[..]].concat();
        let slice = cx.g.slice(x, &start, &limit, &vec![1; n + 4]);
        cx.g.reshape(slice, &part_shape)
    });
    Ok(vec![cx.g.convert(r, t.dtype)])
}
