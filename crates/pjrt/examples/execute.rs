//! Times one StableHLO program through this crate alone: its execute call, and
//! its execute-and-wait, on inputs of its parameters' types (zeros; on the CPU
//! plugin, floats of any value run as fast). `bench/program.py` sets it beside
//! torchtpu's flush of the same program and JAX's execution of it.
//!
//!     cargo run --release -p pjrt --example execute -- PLUGIN PROGRAM.mlir [GAP_US]
//!
//! With `GAP_US`, the thread stays busy that long before each call, as a host
//! recording the next step would: on XLA:CPU a program met again after such
//! a gap runs slower than one launched back to back (bench/RESULTS.md).
use std::time::Instant;

use pjrt::{Buffer, ElementType, NamedValue};

fn main() -> pjrt::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (plugin, program, gap) = match &args[..] {
        [_, plugin, program] => (plugin, program, 0),
        [_, plugin, program, gap] => (plugin, program, gap.parse::<u64>().expect("GAP_US: microseconds")),
        _ => panic!("usage: execute PLUGIN PROGRAM.mlir [GAP_US]"),
    };
    let gap = std::time::Duration::from_micros(gap);
    let text = std::fs::read_to_string(program).expect("reading the program");
    let api = pjrt::load_plugin(plugin.as_ref())?;
    let client = pjrt::Client::new(api, &[("cpu_device_count", NamedValue::Int64(1))])?;
    let device = client.addressable_devices()[0];
    let exe = client.compile(&text)?;
    let inputs = parameters(&text)
        .iter()
        .map(|(ty, dims)| {
            let bytes = dims.iter().product::<i64>() as usize * ty.byte_size();
            client.buffer_from_host(&vec![0u8; bytes], *ty, dims, device)
        })
        .collect::<pjrt::Result<Vec<Buffer>>>()?;
    let refs: Vec<&Buffer> = inputs.iter().collect();
    // Every input kept: a program that donates would consume them.
    let kept: Vec<i64> = (0..refs.len() as i64).collect();
    for _ in 0..20 {
        exe.execute(&refs, device, &kept)?[0].await_ready()?;
    }
    let calls = 200;
    let (mut best_launch, mut best_total) = (f64::MAX, f64::MAX);
    for _ in 0..5 {
        let (mut launch, mut total) = (0.0, 0.0);
        for _ in 0..calls {
            let busy = Instant::now();
            while busy.elapsed() < gap {
                std::hint::spin_loop();
            }
            let start = Instant::now();
            let outputs = exe.execute(&refs, device, &kept)?;
            launch += start.elapsed().as_secs_f64();
            outputs[0].await_ready()?;
            total += start.elapsed().as_secs_f64();
        }
        if total < best_total {
            (best_launch, best_total) = (launch, total);
        }
    }
    let us = |s: f64| s / calls as f64 * 1e6;
    println!("{{\"launch\": {:.1}, \"total\": {:.1}}}", us(best_launch), us(best_total));
    Ok(())
}

/// The element type and dimensions of each parameter of `@main`.
fn parameters(text: &str) -> Vec<(ElementType, Vec<i64>)> {
    let start = text.find("@main(").expect("a @main function") + "@main(".len();
    let signature = &text[start..start + text[start..].find(") ->").expect("@main's results")];
    signature
        .split("tensor<")
        .skip(1)
        .map(|rest| {
            let mut parts: Vec<&str> = rest[..rest.find('>').unwrap()].split('x').collect();
            let ty = match parts.pop().unwrap() {
                "f32" => ElementType::F32,
                "f64" => ElementType::F64,
                "bf16" => ElementType::BF16,
                "i64" => ElementType::S64,
                "i32" => ElementType::S32,
                "ui64" => ElementType::U64,
                "ui32" => ElementType::U32,
                "ui8" => ElementType::U8,
                "i1" => ElementType::Pred,
                other => panic!("a parameter of type {other}"),
            };
            (ty, parts.iter().map(|d| d.parse().expect("a static dimension")).collect())
        })
        .collect()
}
