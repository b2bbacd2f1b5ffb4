//! Compiles every `src/bpf/<name>.bpf.c` into a CO-RE object and a Rust skeleton `<name>.skel.rs` in OUT_DIR,
//! with warnings as errors; and checks that every header of src/bpf compiles on its own, rendering the types and
//! enums of those that modules below `collect` share (`ABI_HEADERS`) as Rust.
//!
//! The collectors that run on kernels without `bpf_loop` (before 5.17: `COMPAT_OBJECTS`) are compiled a second
//! time with `-DMYPROBE_COMPAT` (compat.h). Its skeleton must be the same as the first's but for the object's
//! bytes: the same maps, programs and types, so one skeleton serves both, and the skeleton's object is chosen
//! when it is opened (`collect::features::object_for_kernel`).
use std::{
    env, fs,
    path::{Path, PathBuf},
    sync::atomic::{AtomicUsize, Ordering},
};

use libbpf_cargo::SkeletonBuilder;

/// The objects also built for kernels before 5.17 (compat.h); the others refuse there.
const COMPAT_OBJECTS: &[&str] = &["cpu", "locks", "offcpu", "queries", "syscalls", "threads"];

/// Headers whose types and enums modules below `collect` use (they may not import a collector's skeleton): each
/// one's check also renders its BTF as Rust, a skeleton's `types` module, in OUT_DIR/<name>_abi.rs, with every enum
/// it defines (given a variable of its type there, as BTF holds only the types something uses).
const ABI_HEADERS: &[&str] = &["protocol.h", "unwind.h"];

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
    fs::write(
        out.join("compat_objects.rs"),
        format!("pub const COMPAT_OBJECTS: &[&str] = &{COMPAT_OBJECTS:?};\n"),
    )
    .expect("OUT_DIR is writable");
    let mut entries: Vec<PathBuf> = fs::read_dir("src/bpf")
        .expect("src/bpf exists")
        .map(|e| e.expect("readable").path())
        .collect();
    // The programs first (the longest compiles), then the headers' checks.
    entries.sort_by_key(|p| (!p.to_string_lossy().ends_with(".bpf.c"), p.clone()));
    // Each clang on a job of cargo's: the build script is on every build's critical path.
    let jobs = env::var("NUM_JOBS")
        .ok()
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(1)
        .clamp(1, entries.len().max(1));
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(|| {
                while let Some(path) = entries.get(next.fetch_add(1, Ordering::Relaxed)) {
                    build_entry(path, &out, &clang_args);
                }
            });
        }
    });
}

/// Builds one file of src/bpf: a program's object and skeleton (twice for `COMPAT_OBJECTS`), or a header's check.
fn build_entry(path: &Path, out: &Path, clang_args: &[String]) {
    let Some(file) = path.file_name().and_then(|f| f.to_str()) else {
        return;
    };
    if let Some(name) = file.strip_suffix(".bpf.c") {
        let skel = out.join(format!("{name}.skel.rs"));
        build_skeleton(path, &out.join(format!("{name}.bpf.o")), clang_args, &skel);
        if COMPAT_OBJECTS.contains(&name) {
            let dir = out.join("compat");
            fs::create_dir_all(&dir).expect("OUT_DIR is writable");
            let compat_skel = dir.join(format!("{name}.skel.rs"));
            let mut compat_args = clang_args.to_vec();
            compat_args.push("-DMYPROBE_COMPAT".to_string());
            build_skeleton(
                path,
                &dir.join(format!("{name}.bpf.o")),
                &compat_args,
                &compat_skel,
            );
            join_compat(&skel, &compat_skel, path);
        }
    } else if let Some(stem) = file.strip_suffix(".h").filter(|_| file != "vmlinux.h") {
        // Self-contained: a header includes what it uses, so any order of includes compiles.
        let check = out.join(format!("header_{stem}.bpf.c"));
        let root = env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
        let mut source = format!("#include \"{root}/src/bpf/{file}\"\n");
        let abi = ABI_HEADERS.contains(&file);
        if abi {
            let text = fs::read_to_string(path).expect("src/bpf's files are text");
            for name in defined_types(&text, "enum ") {
                source.push_str(&format!("enum {name} abi_{name};\n"));
            }
        }
        fs::write(&check, source).expect("OUT_DIR is writable");
        let mut builder = SkeletonBuilder::new();
        builder
            .source(&check)
            .obj(check.with_extension("o"))
            .clang_args(clang_args);
        let compiled = if abi {
            let skel = check.with_extension("skel.rs");
            builder.build_and_generate(&skel).map(|()| {
                let types = types_module(&fs::read_to_string(&skel).expect("just written"));
                fs::write(out.join(format!("{stem}_abi.rs")), types).expect("OUT_DIR is writable");
            })
        } else {
            builder.build()
        };
        compiled
            .unwrap_or_else(|e| panic!("{} does not compile on its own: {e:#}", path.display()));
    }
}

fn build_skeleton(source: &Path, obj: &Path, clang_args: &[String], skel: &Path) {
    SkeletonBuilder::new()
        .source(source)
        .obj(obj)
        .reference_obj(true)
        .clang_args(clang_args)
        .build_and_generate(skel)
        .unwrap_or_else(|e| {
            panic!(
                "compiling {}: {e:#}\n(is clang installed? run scripts/setup)",
                source.display()
            )
        });
}

/// Makes `skel` open the compat object on kernels that need it, after checking that the compat skeleton is the
/// same but for its object.
fn join_compat(skel: &Path, compat_skel: &Path, source: &Path) {
    let read = |p: &Path| fs::read_to_string(p).expect("the skeleton was just written");
    let (text, compat) = (read(skel), read(compat_skel));
    let (data, compat_data) = (data_of(&text), data_of(&compat));
    let (outside, types) = split_types(&same_but_maps_sizes(&text.replace(&data, "")));
    let (compat_outside, compat_types) =
        split_types(&same_but_maps_sizes(&compat.replace(&compat_data, "")));
    // What Rust reads in either object: the sections it maps (.bss, .rodata, .data) and myprobe's own types.
    // The kernel's types and the maps' definitions, named in order of use, differ between builds.
    let own = own_types();
    let shared = |header: &str| {
        let name = header
            .trim_end_matches(" {")
            .rsplit(' ')
            .next()
            .unwrap_or_default()
            .split('(')
            .next()
            .unwrap_or_default();
        let section = ["bss", "rodata", "data"]
            .iter()
            .any(|s| name.starts_with(s));
        (section, section || own.iter().any(|o| o == name))
    };
    // Own types only one build uses (the callbacks' arguments) are not read by Rust.
    let differing: Vec<&String> = types
        .iter()
        .filter(|(header, block)| {
            let (section, compared) = shared(header);
            compared && compat_types.get(*header).map_or(section, |b| b != *block)
        })
        .map(|(header, _)| header)
        .collect();
    // Maps are listed in their order of first use, which differs.
    let sorted = |text: &str| {
        let mut lines: Vec<&str> = text.lines().collect();
        lines.sort();
        lines.join("\n")
    };
    if sorted(&outside) != sorted(&compat_outside) || !differing.is_empty() {
        panic!(
            "{}: built with -DMYPROBE_COMPAT, its maps, programs or types differ from the normal build's \
             ({differing:?}); compat.h must keep every name and type (diff {} {})",
            source.display(),
            skel.display(),
            compat_skel.display()
        );
    }
    let opened = "ObjectSkeletonConfigBuilder::new(&DATA)";
    assert!(
        text.contains(opened),
        "libbpf-cargo's skeleton changed: {opened} not found"
    );
    let joined = text
        .replace(
            opened,
            "ObjectSkeletonConfigBuilder::new(crate::collect::features::object_for_kernel(&DATA, &DATA_COMPAT))",
        )
        .replace(
            &data,
            &format!("{data}\n{}", compat_data.replace("static DATA:", "static DATA_COMPAT:")),
        );
    fs::write(skel, joined).expect("OUT_DIR is writable");
}

/// `text` without the numbers of its maps' definitions (type, flags, size: compat.h's THREAD_STORAGE is a task
/// storage in one build and a hash in the other), which the skeleton renders as array lengths.
fn same_but_maps_sizes(text: &str) -> String {
    text.lines()
        .map(|line| {
            let field = line.trim_start();
            let numbered = [
                "pub r#type: *mut [i32; ",
                "pub map_flags: *mut [i32; ",
                "pub max_entries: *mut [i32; ",
            ];
            match numbered.iter().find(|p| field.starts_with(*p)) {
                Some(p) => p.to_string(),
                None => line.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The statement that includes a skeleton's object: `static DATA: [u8; N] = *include_bytes!("….bpf.o");`, which
/// rustfmt may have split over lines.
fn data_of(text: &str) -> String {
    let start = text
        .find("static DATA:")
        .expect("a skeleton includes its object as DATA");
    let object = start
        + text[start..]
            .find(".bpf.o\"")
            .expect("DATA names its object");
    let end = object + text[object..].find(';').expect("DATA's statement ends") + 1;
    text[start..end].to_string()
}

/// `text` without its `types` module, and that module's items by their first line (`pub struct name {`,
/// `impl Default for name {`), each with its attributes.
fn split_types(text: &str) -> (String, std::collections::BTreeMap<String, String>) {
    let lines: Vec<&str> = text.lines().collect();
    let indent_of = |l: &str| l.len() - l.trim_start().len();
    let Some(start) = lines
        .iter()
        .position(|l| l.trim_start() == "pub mod types {")
    else {
        return (text.to_string(), Default::default());
    };
    let outer = indent_of(lines[start]);
    let end = start
        + lines[start..]
            .iter()
            .position(|l| indent_of(l) == outer && l.trim_start() == "}")
            .expect("the types module ends");
    let mut items = std::collections::BTreeMap::new();
    let mut block: Vec<&str> = Vec::new();
    let mut header = String::new();
    for line in &lines[start + 1..end] {
        block.push(line);
        let t = line.trim_start();
        if indent_of(line) != outer + 4 || t.starts_with("#[") {
            continue;
        }
        if header.is_empty() {
            header = t.to_string();
        }
        if t == "}" || t.ends_with(';') || t.ends_with("{}") {
            items.insert(std::mem::take(&mut header), block.join("\n"));
            block.clear();
        }
    }
    let outside = [&lines[..start], &lines[end + 1..]].concat().join("\n");
    (outside, items)
}

/// The names of the structs and enums src/bpf defines (not the kernel's, in vmlinux.h).
fn own_types() -> Vec<String> {
    let mut names = Vec::new();
    for entry in fs::read_dir("src/bpf").expect("src/bpf exists") {
        let path = entry.expect("readable").path();
        if path.file_name().is_some_and(|f| f == "vmlinux.h") {
            continue;
        }
        let text = fs::read_to_string(&path).expect("src/bpf's files are text");
        for kind in ["struct ", "enum "] {
            names.extend(defined_types(&text, kind));
        }
    }
    names
}

/// The names of the types of `kind` (`"struct "`, `"enum "`) that `text` defines at the start of a line.
fn defined_types(text: &str, kind: &str) -> Vec<String> {
    let mut names = Vec::new();
    for rest in text.lines().filter_map(|line| line.strip_prefix(kind)) {
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() && rest[name.len()..].trim_start().starts_with(['{', ':']) {
            names.push(name);
        }
    }
    names
}

/// The items of a skeleton's `types` module, to be included in a module of their own.
fn types_module(skeleton: &str) -> String {
    let lines: Vec<&str> = skeleton.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.trim_start() == "pub mod types {")
        .expect("a skeleton has a types module");
    let indent = lines[start].len() - lines[start].trim_start().len();
    let mut items = String::new();
    for line in &lines[start + 1..] {
        let inner = line.get(indent + 4..).unwrap_or(line.trim_start());
        if line.len() - line.trim_start().len() == indent && line.trim_start() == "}" {
            return items;
        }
        // Its glob import of the skeleton's module, which the types do not need.
        if !inner.starts_with("#[allow(unused_imports)]") && !inner.starts_with("use super::*;") {
            items.push_str(inner);
            items.push('\n');
        }
    }
    panic!("the types module of a skeleton ends")
}
