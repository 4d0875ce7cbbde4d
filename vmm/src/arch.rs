//! Architecture-specific vCPU and boot set-up. Only x86_64 is supported.

pub mod x86_64;
