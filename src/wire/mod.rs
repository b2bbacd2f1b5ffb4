//! What the client and server write to each other, parsed: the protocol's packets (protocol.rs), the compressed
//! protocol (compression.rs) and a statement's fingerprint (fingerprint.rs). Pure functions of bytes and text,
//! fed untrusted input: a leaf that imports nothing else of myprobe's.

pub mod compression;
pub mod fingerprint;
pub mod protocol;

pub mod abi;
