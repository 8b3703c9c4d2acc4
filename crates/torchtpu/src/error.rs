//! Errors carried to Python as the exception type PyTorch would raise.
use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Runtime = 1,
    Value = 2,
    Index = 3,
    Type = 4,
    NotImplemented = 5,
    /// torch.linalg.LinAlgError (a RuntimeError).
    LinAlg = 6,
    /// Not an error: this call's arguments are beyond the lowering (complex
    /// tensors), so the adapter runs it through the counted CPU fallback.
    Fallback = 7,
    /// torch.OutOfMemoryError (a RuntimeError): the device's memory is exhausted.
    OutOfMemory = 9,
}

#[derive(Clone, Debug)]
pub struct Error {
    pub kind: Kind,
    pub message: String,
}

pub type Result<T> = std::result::Result<T, Error>;

/// Whether the torch built against (build.rs) is `major.minor` or newer:
/// messages that PyTorch reworded follow the version in use.
pub fn torch_at_least(major: u32, minor: u32) -> bool {
    let mut parts = env!("TORCHTPU_TORCH_VERSION").split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) >= (major, minor)
}

impl Error {
    pub fn runtime(message: impl Into<String>) -> Error {
        Error { kind: Kind::Runtime, message: message.into() }
    }
    pub fn value(message: impl Into<String>) -> Error {
        Error { kind: Kind::Value, message: message.into() }
    }
    pub fn index(message: impl Into<String>) -> Error {
        Error { kind: Kind::Index, message: message.into() }
    }
    pub fn type_error(message: impl Into<String>) -> Error {
        Error { kind: Kind::Type, message: message.into() }
    }
    pub fn not_implemented(message: impl Into<String>) -> Error {
        Error { kind: Kind::NotImplemented, message: message.into() }
    }
    /// Asks the adapter to run this call through the counted CPU fallback.
    pub fn fallback(message: impl Into<String>) -> Error {
        Error { kind: Kind::Fallback, message: message.into() }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// PJRT's (absl's) status code of exhausted device memory.
pub const RESOURCE_EXHAUSTED: i32 = 8;

impl From<pjrt::Error> for Error {
    fn from(e: pjrt::Error) -> Error {
        let kind = if e.code == RESOURCE_EXHAUSTED { Kind::OutOfMemory } else { Kind::Runtime };
        Error { kind, message: format!("XLA: {e}") }
    }
}

impl Error {
    /// `e` said of `what` on tpu:`device`: out of memory (with what the user
    /// can do about it) or a failure.
    pub fn on_device(e: pjrt::Error, what: &str, device: usize) -> Error {
        if e.code == RESOURCE_EXHAUSTED {
            Error {
                kind: Kind::OutOfMemory,
                message: format!(
                    "torchtpu: out of memory on tpu:{device} {what}: {}. Free tensors that are no longer needed (del them, \
                     gc.collect()) or reduce the batch size.",
                    e.message.trim_end_matches('.')
                ),
            }
        } else {
            Error::runtime(format!("torchtpu: {what} failed on tpu:{device}: {e}"))
        }
    }
}

/// `TORCH_CHECK`: a RuntimeError unless `cond` holds.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err($crate::error::Error::runtime(format!($($fmt)+)));
        }
    };
}
