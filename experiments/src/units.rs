//! Units the tables report in.

/// Bytes per MiB.
pub const MIB: f64 = 1024.0 * 1024.0;
