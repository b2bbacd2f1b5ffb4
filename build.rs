//! Compiles every `src/bpf/<name>.bpf.c` into a CO-RE object and a Rust skeleton `<name>.skel.rs` in OUT_DIR.
use std::{env, fs, path::PathBuf};

use libbpf_cargo::SkeletonBuilder;

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"));
    let arch = match env::var("CARGO_CFG_TARGET_ARCH").as_deref() {
        Ok("x86_64") => "x86",
        Ok("aarch64") => "arm64",
        Ok(other) => panic!("unsupported target architecture {other}"),
        Err(_) => "x86",
    };
    println!("cargo:rerun-if-changed=src/bpf");
    for entry in fs::read_dir("src/bpf").expect("src/bpf exists") {
        let path = entry.expect("readable src/bpf").path();
        let Some(file) = path.file_name().and_then(|f| f.to_str()) else { continue };
        let Some(name) = file.strip_suffix(".bpf.c") else { continue };
        SkeletonBuilder::new()
            .source(&path)
            .clang_args([format!("-D__TARGET_ARCH_{arch}"), "-Isrc/bpf".to_string(), "-O2".to_string()])
            .build_and_generate(out.join(format!("{name}.skel.rs")))
            .unwrap_or_else(|e| panic!("compiling {}: {e:#}\n(is clang installed? run scripts/setup)", path.display()));
    }
}
