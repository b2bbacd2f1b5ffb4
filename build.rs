//! Compiles every `src/bpf/<name>.bpf.c` into a CO-RE object and a Rust skeleton `<name>.skel.rs` in OUT_DIR,
//! with warnings as errors; and checks that every header of src/bpf compiles on its own.
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
    // libbpf's usdt.bpf.h includes <linux/errno.h>, whose <asm/errno.h> lives in the multiarch directory.
    let multiarch = match arch {
        "arm64" => "/usr/include/aarch64-linux-gnu",
        _ => "/usr/include/x86_64-linux-gnu",
    };
    let clang_args = [
        format!("-D__TARGET_ARCH_{arch}"),
        format!("-idirafter{multiarch}"),
        "-Isrc/bpf".to_string(),
        "-O2".to_string(),
        "-Wall".to_string(),
        "-Wextra".to_string(),
        "-Werror".to_string(),
    ];
    println!("cargo:rerun-if-changed=src/bpf");
    let mut entries: Vec<PathBuf> = fs::read_dir("src/bpf")
        .expect("src/bpf exists")
        .map(|e| e.expect("readable").path())
        .collect();
    entries.sort();
    for path in &entries {
        let Some(file) = path.file_name().and_then(|f| f.to_str()) else {
            continue;
        };
        if let Some(name) = file.strip_suffix(".bpf.c") {
            SkeletonBuilder::new()
                .source(path)
                .clang_args(&clang_args)
                .build_and_generate(out.join(format!("{name}.skel.rs")))
                .unwrap_or_else(|e| {
                    panic!(
                        "compiling {}: {e:#}\n(is clang installed? run scripts/setup)",
                        path.display()
                    )
                });
        } else if file.ends_with(".h") && file != "vmlinux.h" {
            // Self-contained: a header includes what it uses, so any order of includes compiles.
            let check = out.join(format!("header_{}.bpf.c", file.trim_end_matches(".h")));
            let root = env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
            fs::write(&check, format!("#include \"{root}/src/bpf/{file}\"\n"))
                .expect("OUT_DIR is writable");
            SkeletonBuilder::new()
                .source(&check)
                .obj(check.with_extension("o"))
                .clang_args(&clang_args)
                .build()
                .unwrap_or_else(|e| {
                    panic!("{} does not compile on its own: {e:#}", path.display())
                });
        }
    }
}
