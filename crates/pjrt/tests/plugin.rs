//! End-to-end tests against a real plugin (the XLA CPU plugin by default).

mod common;

use common::plugin_path;
use pjrt::{Api, Buffer, Client, ElementType, NamedValue};

fn api() -> &'static Api {
    pjrt::load_plugin(&plugin_path()).expect("load the PJRT plugin")
}

fn client_with_devices(count: i64) -> Client {
    Client::new(api(), &[("cpu_device_count", NamedValue::Int64(count))]).expect("create a client")
}

fn client() -> Client {
    client_with_devices(1)
}

const ADD: &str = r#"
func.func @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.add %a, %b : tensor<4xf32>
  return %0 : tensor<4xf32>
}
"#;

const ADD_DONATING_A: &str = r#"
func.func @main(%a: tensor<4xf32> {jax.buffer_donor = true}, %b: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.add %a, %b : tensor<4xf32>
  return %0 : tensor<4xf32>
}
"#;

fn upload(client: &Client, values: &[f32]) -> Buffer {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
    let device = client.addressable_devices()[0];
    client.buffer_from_host(&bytes, ElementType::F32, &[values.len() as i64], device).unwrap()
}

fn download(buffer: &Buffer) -> Vec<f32> {
    let mut bytes = vec![0u8; buffer.on_device_size().unwrap()];
    buffer.to_host(&mut bytes).unwrap();
    bytes.chunks_exact(4).map(|c| f32::from_ne_bytes(c.try_into().unwrap())).collect()
}

#[test]
fn loads_once_and_reports_version_and_attributes() {
    let api = api();
    assert!(std::ptr::eq(api, pjrt::load_plugin(&plugin_path()).unwrap()));
    let (major, minor) = api.version();
    assert_eq!(major, 0);
    assert!(minor >= pjrt::sys::PJRT_API_MINOR as i32);
    assert!(api.attributes().iter().any(|(name, value)| name == "stablehlo_current_version"
        && matches!(value, NamedValue::Int64List(v) if v.len() == 3)));
}

#[test]
fn bad_plugin_paths_are_errors_naming_the_path() {
    let missing = std::path::Path::new("/nonexistent/dir/libnot_a_plugin.so");
    let err = pjrt::load_plugin(missing).unwrap_err();
    assert!(err.message.contains("/nonexistent/dir/libnot_a_plugin.so"), "{err}");

    // A real shared library without GetPjrtApi.
    let libm = std::path::Path::new("/lib/x86_64-linux-gnu/libm.so.6");
    if libm.exists() {
        let err = pjrt::load_plugin(libm).unwrap_err();
        assert!(err.message.contains("libm"), "{err}");
        assert!(err.message.contains("GetPjrtApi"), "{err}");
    }
}

#[test]
fn client_with_one_cpu_device() {
    let client = client();
    assert_eq!(client.platform_name(), "cpu");
    let devices = client.addressable_devices();
    assert_eq!(devices.len(), 1);
    assert_eq!(devices[0].kind(), "cpu");
    assert_eq!(devices[0].id(), 0);
    assert!(!devices[0].debug_string().is_empty());
}

#[test]
fn wrongly_typed_cpu_device_count_is_an_error_not_an_abort() {
    let err = Client::new(api(), &[("cpu_device_count", NamedValue::Bool(true))]).unwrap_err();
    assert!(err.message.contains("cpu_device_count"), "{err}");
}

#[test]
fn add_round_trip() {
    let client = client();
    let exe = client.compile(ADD).unwrap();
    assert_eq!(exe.num_outputs(), 1);
    let a = upload(&client, &[1.0, 2.0, 3.0, 4.0]);
    let b = upload(&client, &[10.0, 20.0, 30.0, 40.0]);
    let device = client.addressable_devices()[0];
    let out = exe.execute(&[&a, &b], device, &[]).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].element_type().unwrap(), ElementType::F32);
    assert_eq!(out[0].dims().unwrap(), [4]);
    assert_eq!(download(&out[0]), [11.0, 22.0, 33.0, 44.0]);
    assert!(out[0].ready_event().unwrap().is_ready().unwrap());
    assert!(!a.is_deleted().unwrap());
}

#[test]
fn thousand_chained_executions() {
    let client = client();
    let exe = client.compile(ADD).unwrap();
    let device = client.addressable_devices()[0];
    let one = upload(&client, &[1.0; 4]);
    let mut x = upload(&client, &[0.0, 1.0, 2.0, 3.0]);
    for _ in 0..1000 {
        x = exe.execute(&[&x, &one], device, &[]).unwrap().remove(0);
    }
    x.await_ready().unwrap();
    assert_eq!(download(&x), [1000.0, 1001.0, 1002.0, 1003.0]);
}

#[test]
fn bad_mlir_is_an_error_with_xla_message() {
    let err = client().compile("func.func @main( this is not mlir").unwrap_err();
    assert!(!err.message.is_empty());
    assert_ne!(err.code, 0);
}

#[test]
fn mismatched_host_data_is_an_error() {
    let client = client();
    let device = client.addressable_devices()[0];
    let err = client.buffer_from_host(&[0u8; 12], ElementType::F32, &[4], device).unwrap_err();
    assert_eq!(err.code_name(), "INVALID_ARGUMENT");
    let buffer = upload(&client, &[1.0; 4]);
    assert!(buffer.to_host(&mut [0u8; 12]).is_err());
}

#[test]
fn serialize_and_deserialize_round_trip() {
    let client = client();
    let exe = client.compile(ADD).unwrap();
    let blob = exe.serialize().unwrap();
    assert!(!exe.fingerprint().unwrap().is_empty());

    let loaded = client.deserialize(&blob).unwrap();
    let a = upload(&client, &[1.0, 2.0, 3.0, 4.0]);
    let b = upload(&client, &[0.5; 4]);
    let device = client.addressable_devices()[0];
    let expected = download(&exe.execute(&[&a, &b], device, &[]).unwrap()[0]);
    let got = download(&loaded.execute(&[&a, &b], device, &[]).unwrap()[0]);
    assert_eq!(got, expected);
    assert_eq!(got, [1.5, 2.5, 3.5, 4.5]);

    assert!(client.deserialize(&blob[..blob.len() / 2]).is_err());
}

#[test]
fn donated_argument_is_consumed_unless_marked_non_donatable() {
    let client = client();
    let exe = client.compile(ADD_DONATING_A).unwrap();
    let device = client.addressable_devices()[0];
    let b = upload(&client, &[1.0; 4]);

    let kept = upload(&client, &[1.0, 2.0, 3.0, 4.0]);
    let out = exe.execute(&[&kept, &b], device, &[0]).unwrap();
    assert_eq!(download(&out[0]), [2.0, 3.0, 4.0, 5.0]);
    assert!(!kept.is_deleted().unwrap());
    assert_eq!(download(&kept), [1.0, 2.0, 3.0, 4.0]);

    let donated = upload(&client, &[1.0, 2.0, 3.0, 4.0]);
    let out = exe.execute(&[&donated, &b], device, &[]).unwrap();
    assert_eq!(download(&out[0]), [2.0, 3.0, 4.0, 5.0]);
    assert!(donated.is_deleted().unwrap());
    assert!(donated.to_host(&mut [0u8; 16]).is_err());
}

#[test]
fn devices_of_another_client_are_rejected() {
    let (first, second) = (client(), client());
    let exe = first.compile(ADD).unwrap();
    let a = upload(&first, &[1.0; 4]);
    let foreign = second.addressable_devices()[0];
    assert!(first.buffer_from_host(&[0u8; 4], ElementType::F32, &[1], foreign).is_err());
    assert!(exe.execute(&[&a, &a], foreign, &[]).is_err());
    let b = upload(&second, &[1.0; 4]);
    let device = first.addressable_devices()[0];
    assert!(exe.execute(&[&a, &b], device, &[]).is_err());
}

#[test]
fn executables_run_only_on_the_device_they_were_compiled_for() {
    let client = client_with_devices(2);
    let devices = client.addressable_devices();
    assert_eq!(devices.len(), 2);
    let exe = client.compile(ADD).unwrap();
    let a = client.buffer_from_host(&[0u8; 16], ElementType::F32, &[4], devices[1]).unwrap();
    let err = exe.execute(&[&a, &a], devices[1], &[]).unwrap_err();
    assert!(err.message.contains("compiled for another device"), "{err}");
}

#[test]
fn handles_are_shared_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Client>();
    assert_send_sync::<Buffer>();
    assert_send_sync::<pjrt::LoadedExecutable>();
    assert_send_sync::<pjrt::Event>();
    assert_send_sync::<pjrt::Device<'static>>();

    let client = client();
    let exe = client.compile(ADD).unwrap();
    let device = client.addressable_devices()[0];
    let a = upload(&client, &[1.0, 2.0, 3.0, 4.0]);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                for _ in 0..100 {
                    let out = exe.execute(&[&a, &a], device, &[]).unwrap();
                    assert_eq!(download(&out[0]), [2.0, 4.0, 6.0, 8.0]);
                }
            });
        }
    });
}

const ALL_REDUCE: &str = r#"
func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = "stablehlo.all_reduce"(%a) ({
  ^bb0(%x: tensor<f32>, %y: tensor<f32>):
    %s = stablehlo.add %x, %y : tensor<f32>
    stablehlo.return %s : tensor<f32>
  }) {replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
"#;

#[test]
fn replicated_programs_run_collectives_across_devices() {
    let client = client_with_devices(3);
    let devices = client.addressable_devices();
    // Replicas on devices 2 and 0, in that order.
    let exe = client.compile_replicated(ALL_REDUCE, &[devices[2].id(), devices[0].id()]).unwrap();
    let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>();
    let a = client.buffer_from_host(&bytes(&[1., 2., 3., 4.]), ElementType::F32, &[4], devices[2]).unwrap();
    let b = client.buffer_from_host(&bytes(&[10., 20., 30., 40.]), ElementType::F32, &[4], devices[0]).unwrap();
    let outputs = exe.execute_replicated(&[vec![&a], vec![&b]]).unwrap();
    for out in &outputs {
        assert_eq!(download(&out[0]), [11., 22., 33., 44.]);
    }
    assert!(exe.execute_replicated(&[vec![&a]]).is_err());
}

#[test]
fn an_uninitialized_buffer_takes_what_is_written_at_its_host_address() {
    let client = client();
    let device = client.addressable_devices()[0];
    let buffer = client.uninitialized_buffer(ElementType::F32, &[3], device).unwrap();
    let address = buffer.host_address().expect("the CPU plugin's memory is the host's").cast::<f32>();
    // SAFETY: three f32s, the buffer's own, which no computation uses.
    unsafe { std::ptr::copy_nonoverlapping([1.5f32, -2.0, 4.0].as_ptr(), address, 3) };
    assert_eq!(download(&buffer), [1.5, -2.0, 4.0]);
}
