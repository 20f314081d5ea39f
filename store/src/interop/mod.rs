//! Interop with the array files users already have: `.npz` and `.safetensors`.
pub mod export;
