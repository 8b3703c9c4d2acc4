//! Errors: a PJRT status code and message, copied out of the plugin's `PJRT_Error`.

use std::fmt;

use crate::sys;

/// An error from the plugin (its `PJRT_Error`, already destroyed) or from this crate's
/// own checks, which use the same status codes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    /// A `PJRT_Error_Code` (the absl status codes: 3 = INVALID_ARGUMENT, 13 = INTERNAL…).
    pub code: i32,
    pub message: String,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn new(code: sys::PJRT_Error_Code, message: impl Into<String>) -> Self {
        Error { code: code as i32, message: message.into() }
    }

    pub(crate) fn invalid_argument(message: impl Into<String>) -> Self {
        Self::new(sys::PJRT_Error_Code_PJRT_Error_Code_INVALID_ARGUMENT, message)
    }

    /// The code's name, e.g. `"INVALID_ARGUMENT"`.
    pub fn code_name(&self) -> &'static str {
        const NAMES: [&str; 17] = [
            "OK",
            "CANCELLED",
            "UNKNOWN",
            "INVALID_ARGUMENT",
            "DEADLINE_EXCEEDED",
            "NOT_FOUND",
            "ALREADY_EXISTS",
            "PERMISSION_DENIED",
            "RESOURCE_EXHAUSTED",
            "FAILED_PRECONDITION",
            "ABORTED",
            "OUT_OF_RANGE",
            "UNIMPLEMENTED",
            "INTERNAL",
            "UNAVAILABLE",
            "DATA_LOSS",
            "UNAUTHENTICATED",
        ];
        usize::try_from(self.code).ok().and_then(|i| NAMES.get(i)).copied().unwrap_or("UNKNOWN")
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code_name(), self.message)
    }
}

impl std::error::Error for Error {}
