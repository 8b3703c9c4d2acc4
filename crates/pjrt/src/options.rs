//! Hand-encoded `xla.CompileOptionsProto` (no protobuf dependency for a few fields).

// Field numbers from xla/pjrt/proto/compile_options.proto.
const COMPILE_OPTIONS_EXECUTABLE_BUILD_OPTIONS: u32 = 3;
const COMPILE_OPTIONS_COMPILE_PORTABLE_EXECUTABLE: u32 = 4;
const BUILD_OPTIONS_NUM_REPLICAS: u32 = 4;
const BUILD_OPTIONS_NUM_PARTITIONS: u32 = 5;
const BUILD_OPTIONS_DEVICE_ASSIGNMENT: u32 = 9;
// xla.DeviceAssignmentProto and its ComputationDevice.
const ASSIGNMENT_REPLICA_COUNT: u32 = 1;
const ASSIGNMENT_COMPUTATION_COUNT: u32 = 2;
const ASSIGNMENT_COMPUTATION_DEVICES: u32 = 3;
const COMPUTATION_DEVICE_REPLICA_IDS: u32 = 1;

const WIRE_VARINT: u32 = 0;
const WIRE_LEN: u32 = 2;

/// Options for a single-device program. `num_replicas` and `num_partitions` must be
/// explicit: when absent (even empty options) the CPU plugin aborts the process with
/// `Check failed: replica_count > 0` instead of returning an error. A portable
/// program runs on any device of the client (named at launch).
pub(crate) fn single_device(portable: bool) -> Vec<u8> {
    let mut build = Vec::new();
    varint_field(&mut build, BUILD_OPTIONS_NUM_REPLICAS, 1);
    varint_field(&mut build, BUILD_OPTIONS_NUM_PARTITIONS, 1);
    let mut options = Vec::new();
    len_field(&mut options, COMPILE_OPTIONS_EXECUTABLE_BUILD_OPTIONS, &build);
    if portable {
        varint_field(&mut options, COMPILE_OPTIONS_COMPILE_PORTABLE_EXECUTABLE, 1);
    }
    options
}

/// Options for a program replicated over `devices` (global device ids): replica
/// i runs on `devices[i]`, and the program's collectives span the replicas.
pub(crate) fn replicated(devices: &[i32]) -> Vec<u8> {
    let mut ids = Vec::new();
    for &d in devices {
        varint_field(&mut ids, COMPUTATION_DEVICE_REPLICA_IDS, d as i64 as u64);
    }
    let mut assignment = Vec::new();
    varint_field(&mut assignment, ASSIGNMENT_REPLICA_COUNT, devices.len() as u64);
    varint_field(&mut assignment, ASSIGNMENT_COMPUTATION_COUNT, 1);
    // One computation (no partitions): its device per replica.
    len_field(&mut assignment, ASSIGNMENT_COMPUTATION_DEVICES, &ids);
    let mut build = Vec::new();
    varint_field(&mut build, BUILD_OPTIONS_NUM_REPLICAS, devices.len() as u64);
    varint_field(&mut build, BUILD_OPTIONS_NUM_PARTITIONS, 1);
    len_field(&mut build, BUILD_OPTIONS_DEVICE_ASSIGNMENT, &assignment);
    let mut options = Vec::new();
    len_field(&mut options, COMPILE_OPTIONS_EXECUTABLE_BUILD_OPTIONS, &build);
    options
}

fn len_field(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    key(out, field, WIRE_LEN);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn varint_field(out: &mut Vec<u8>, field: u32, value: u64) {
    key(out, field, WIRE_VARINT);
    varint(out, value);
}

fn key(out: &mut Vec<u8>, field: u32, wire_type: u32) {
    varint(out, u64::from(field << 3 | wire_type));
}

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

#[cfg(test)]
mod tests {
    #[test]
    fn single_device_matches_the_bytes_known_to_work() {
        assert_eq!(super::single_device(false), [0x1a, 0x04, 0x20, 0x01, 0x28, 0x01]);
        assert_eq!(super::single_device(true), [0x1a, 0x04, 0x20, 0x01, 0x28, 0x01, 0x20, 0x01]);
    }

    #[test]
    fn replicated_assigns_one_device_per_replica() {
        let assignment = [0x08, 0x02, 0x10, 0x01, 0x1a, 0x04, 0x08, 0x03, 0x08, 0x01];
        let mut expected = vec![0x1a, 0x10, 0x20, 0x02, 0x28, 0x01, 0x4a, assignment.len() as u8];
        expected.extend_from_slice(&assignment);
        assert_eq!(super::replicated(&[3, 1]), expected);
    }

    #[test]
    fn varint_encodes_multi_byte_values() {
        let mut out = Vec::new();
        super::varint(&mut out, 300);
        assert_eq!(out, [0xac, 0x02]);
    }
}
