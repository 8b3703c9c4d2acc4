//! Hand-encoded `xla.CompileOptionsProto` (no protobuf dependency for two fields).

// Field numbers from xla/pjrt/proto/compile_options.proto.
const COMPILE_OPTIONS_EXECUTABLE_BUILD_OPTIONS: u32 = 3;
const COMPILE_OPTIONS_COMPILE_PORTABLE_EXECUTABLE: u32 = 4;
const BUILD_OPTIONS_NUM_REPLICAS: u32 = 4;
const BUILD_OPTIONS_NUM_PARTITIONS: u32 = 5;

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
    key(&mut options, COMPILE_OPTIONS_EXECUTABLE_BUILD_OPTIONS, WIRE_LEN);
    varint(&mut options, build.len() as u64);
    options.extend_from_slice(&build);
    if portable {
        varint_field(&mut options, COMPILE_OPTIONS_COMPILE_PORTABLE_EXECUTABLE, 1);
    }
    options
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
    fn varint_encodes_multi_byte_values() {
        let mut out = Vec::new();
        super::varint(&mut out, 300);
        assert_eq!(out, [0xac, 0x02]);
    }
}
