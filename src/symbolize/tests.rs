//! Tests against real processes: the C fixture `tests/fixtures/symbolize/known_stacks.c` (compiled here, plain
//! and stripped), the test process itself for libc, and the running kernel.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::rc::Rc;
use std::sync::OnceLock;

use object::{Object, ObjectSymbol};

use super::test_support::{build_dir, compile, fixture_source, maps_of, nm, strip, Running};
use super::*;

/// Builds the fixture once per test run: (unstripped, stripped) paths.
fn fixture_binaries() -> &'static (PathBuf, PathBuf) {
    static BUILT: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    BUILT.get_or_init(|| {
        let dir = build_dir("myprobe-symbolize-test-");
        let plain = dir.join("known_stacks");
        let stripped = dir.join("known_stacks_stripped");
        let flags = [
            "cc",
            "-O1",
            "-g",
            "-rdynamic",
            "-fno-inline",
            "-fno-optimize-sibling-calls",
            "-fno-toplevel-reorder",
        ];
        let source = fixture_source("symbolize/known_stacks.c");
        assert!(compile(&flags, &source, &plain, &[]), "cc failed");
        strip(&plain, &stripped);
        (plain, stripped)
    })
}

/// Starts a build of the fixture.
fn start(path: &Path) -> Running {
    Running::start(path, "ret_into_a")
}

/// `nm -S` of a binary: symbol name → size.
fn nm_sizes(path: &Path) -> HashMap<String, u64> {
    let out = Command::new("nm")
        .arg("-S")
        .arg(path)
        .output()
        .expect("running nm");
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let [_addr, size, _kind, name] = f[..] else {
                return None;
            };
            Some((name.to_owned(), u64::from_str_radix(size, 16).ok()?))
        })
        .collect()
}

fn names(v: &[Rc<str>]) -> Vec<&str> {
    v.iter().map(|n| &**n).collect()
}

#[test]
fn unstripped_fixture_names_functions() {
    let (plain, _) = fixture_binaries();
    let syms = nm(plain);
    let fx = start(plain);
    let bias = fx.addr("exported_fn") - syms["exported_fn"];
    let mut s = Symbolizer::new(fx.pid()).unwrap();

    // The chain: leaf first, return addresses after. ret_into_c points just past chain_c (chain_c ends with
    // its call), at chain_b's first byte or in alignment padding: only the -1 rule names chain_c.
    let sizes = nm_sizes(plain);
    assert_eq!(
        fx.addr("ret_into_c"),
        bias + syms["chain_c"] + sizes["chain_c"],
        "the call must be the last instruction of chain_c"
    );
    let stack = [
        fx.addr("chain_leaf") + 4,
        fx.addr("ret_into_c"),
        fx.addr("ret_into_b"),
        fx.addr("ret_into_a"),
    ];
    assert_eq!(
        names(&s.user_stack(&stack)),
        ["chain_leaf", "chain_c", "chain_b", "chain_a"]
    );
    // As the leaf (the exact IP), the same address is not in chain_c.
    let leaf = s.user_stack(&[fx.addr("ret_into_c")]);
    if fx.addr("ret_into_c") == bias + syms["chain_b"] {
        assert_eq!(names(&leaf), ["chain_b"]);
    } else {
        assert_ne!(&*leaf[0], "chain_c");
    }

    assert_eq!(
        names(&s.user_stack(&[fx.addr("static_fn") + 4])),
        ["static_fn"]
    );
    assert_eq!(
        names(&s.user_stack(&[fx.addr("exported_fn")])),
        ["exported_fn"]
    );
    // The sizeless `asm_nosize` symbol must not swallow the unnamed function after it.
    let unnamed_vaddr = fx.addr("unnamed") - bias;
    assert_eq!(
        names(&s.user_stack(&[fx.addr("unnamed") + 3])),
        [format!("known_stacks+0x{unnamed_vaddr:x}")]
    );
    assert_eq!(
        names(&s.user_stack(&[fx.addr("asm_nosize")])),
        ["asm_nosize"]
    );
}

#[test]
fn stripped_fixture_uses_dynsym_then_eh_frame() {
    let (plain, stripped) = fixture_binaries();
    let syms = nm(plain);
    let fx = start(stripped);
    let bias = fx.addr("exported_fn") - syms["exported_fn"];
    let mut s = Symbolizer::new(fx.pid()).unwrap();

    // Exported functions are in .dynsym (-rdynamic); the static ones are named by their FDE start, which is
    // their `nm` address in the unstripped copy.
    let stack = [
        fx.addr("chain_leaf") + 4,
        fx.addr("ret_into_c"),
        fx.addr("ret_into_b"),
        fx.addr("ret_into_a"),
    ];
    let chain_c = format!("known_stacks_stripped+0x{:x}", syms["chain_c"]);
    assert_eq!(
        names(&s.user_stack(&stack)),
        ["chain_leaf", chain_c.as_str(), "chain_b", "chain_a"]
    );

    // static_fn comes right after exported_fn: it must not be named exported_fn.
    let static_fn = format!("known_stacks_stripped+0x{:x}", syms["static_fn"]);
    for off in [0, 4, 0x20] {
        assert_eq!(
            names(&s.user_stack(&[fx.addr("static_fn") + off])),
            [static_fn.as_str()],
            "static_fn+{off}"
        );
    }
    assert_eq!(
        names(&s.user_stack(&[fx.addr("exported_fn") + 2])),
        ["exported_fn"]
    );
    let unnamed_vaddr = fx.addr("unnamed") - bias;
    assert_eq!(
        names(&s.user_stack(&[fx.addr("unnamed") + 3])),
        [format!("known_stacks_stripped+0x{unnamed_vaddr:x}")]
    );
    let st = s.stats();
    assert!(st.no_symbol >= 3, "{st}");
    assert_eq!(st.errors, 0, "{st}");
}

/// Runs a tool of binutils, panicking on failure.
fn run(tool: &str, args: &[&std::ffi::OsStr]) {
    let status = Command::new(tool)
        .args(args)
        .status()
        .unwrap_or_else(|e| panic!("running {tool}: {e}"));
    assert!(status.success(), "{tool} {args:?} failed");
}

#[test]
fn separate_debug_files() {
    let (plain, _) = fixture_binaries();
    let syms = nm(plain);
    let dir = plain.parent().unwrap();
    // Two stripped copies with a .gnu_debuglink to a debug file next to them: one with the symbol table
    // (`objcopy --only-keep-debug`, like Debian's -dbgsym packages), one with DWARF only.
    let mut built = Vec::new();
    for (name, keep_symtab) in [
        ("known_stacks_dbglink", true),
        ("known_stacks_dwarfonly", false),
    ] {
        let bin = dir.join(name);
        let debug = dir.join(format!("{name}.debug"));
        if !bin.exists() {
            run(
                "objcopy",
                &[
                    "--only-keep-debug".as_ref(),
                    plain.as_os_str(),
                    debug.as_os_str(),
                ],
            );
            if !keep_symtab {
                run(
                    "objcopy",
                    &[
                        "--strip-all".as_ref(),
                        "--keep-section=.debug_*".as_ref(),
                        debug.as_os_str(),
                    ],
                );
            }
            let tmp = dir.join(format!("{name}.tmp"));
            run(
                "strip",
                &["-o".as_ref(), tmp.as_os_str(), plain.as_os_str()],
            );
            // The link is looked up by name next to the binary.
            let status = Command::new("objcopy")
                .arg(format!("--add-gnu-debuglink={name}.debug"))
                .arg(&tmp)
                .arg(&bin)
                .current_dir(dir)
                .status()
                .unwrap();
            assert!(status.success());
        }
        built.push(bin);
    }
    for bin in built {
        let fx = start(&bin);
        let mut s = Symbolizer::new(fx.pid()).unwrap();
        let stack = [
            fx.addr("static_fn") + 4,
            fx.addr("ret_into_c"),
            fx.addr("ret_into_b"),
            fx.addr("ret_into_a"),
        ];
        assert_eq!(
            names(&s.user_stack(&stack)),
            ["static_fn", "chain_c", "chain_b", "chain_a"],
            "{}",
            bin.display()
        );
        let bias = fx.addr("exported_fn") - syms["exported_fn"];
        let base = bin.file_name().unwrap().to_str().unwrap();
        assert_eq!(
            names(&s.user_stack(&[fx.addr("unnamed") + 3])),
            [format!("{base}+0x{:x}", fx.addr("unnamed") - bias)]
        );
        assert_eq!(s.stats().errors, 0);
    }
}

#[test]
fn cache_identity_and_stats() {
    let (plain, _) = fixture_binaries();
    let fx = start(plain);
    let mut s = Symbolizer::new(fx.pid()).unwrap();
    let stack = [
        fx.addr("chain_leaf"),
        fx.addr("ret_into_c"),
        fx.addr("ret_into_b"),
        0,
        8,
        u64::MAX,
    ];
    let a = s.user_stack(&stack);
    let misses = s.stats().unique_addrs;
    assert_eq!(misses, 6);
    assert_eq!(a.len(), stack.len());
    assert_eq!(&*a[3], "[unknown]");
    assert_eq!(&*a[5], "[unknown]");
    let b = s.user_stack(&stack);
    assert_eq!(
        s.stats().unique_addrs,
        misses,
        "second call must hit the cache"
    );
    for (x, y) in a.iter().zip(&b) {
        assert!(Rc::ptr_eq(x, y));
    }
    // Names are shared between addresses of the same function.
    let c = s.user_stack(&[fx.addr("chain_leaf") + 1]);
    assert!(Rc::ptr_eq(&a[0], &c[0]));
    assert!(s.user_stack(&[]).is_empty());

    // Cached names survive the process.
    drop(fx);
    assert_eq!(names(&s.user_stack(&stack)), names(&a));
}

#[test]
fn preload_and_errors() {
    assert!(Symbolizer::new(u32::MAX - 1).is_err(), "no such process");
    let (_, stripped) = fixture_binaries();
    let fx = start(stripped);
    let mut plain = Symbolizer::new(fx.pid()).unwrap();
    let mut pre = Symbolizer::new(fx.pid()).unwrap();
    pre.preload(true);
    let stack = [
        fx.addr("static_fn") + 4,
        fx.addr("ret_into_c"),
        fx.addr("ret_into_b"),
        fx.addr("ret_into_a"),
    ];
    assert_eq!(
        names(&pre.user_stack(&stack)),
        names(&plain.user_stack(&stack))
    );
    assert_eq!(pre.stats().errors, 0);
}

/// Load bias of libc in this process and the file behind it.
fn libc_in_self() -> (u64, PathBuf) {
    let malloc = libc::malloc as *const () as usize as u64;
    for m in maps_of(std::process::id()) {
        if (m.start..m.end).contains(&malloc) {
            let path = PathBuf::from(m.path);
            let data = std::fs::read(&path).unwrap();
            let obj = object::File::parse(&*data).unwrap();
            let sym = obj
                .dynamic_symbols()
                .find(|s| s.name() == Ok("malloc"))
                .unwrap();
            return (malloc - sym.address(), path);
        }
    }
    panic!("malloc not in any mapping");
}

#[test]
fn libc_of_this_process() {
    // An anonymous mapping (made before new(): the maps are read then).
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            8192,
            libc::PROT_READ,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    let mut s = Symbolizer::new(std::process::id()).unwrap();
    let n = s.user_stack(&[p as u64 + 100]);
    unsafe { libc::munmap(p, 8192) };
    assert_eq!(names(&n), ["[anon]"]);

    let malloc = libc::malloc as *const () as usize as u64;
    let n = s.user_stack(&[malloc + 1]);
    assert!(["malloc", "__libc_malloc"].contains(&&*n[0]), "{n:?}");
    let n = s.user_stack(&[libc::free as *const () as usize as u64]);
    assert!(["free", "__libc_free", "cfree"].contains(&&*n[0]), "{n:?}");
    // The ELF header of libc is mapped but is no code: no symbol (not `GLIBC_2.2.5`, the sizeless version
    // symbol at 0 in glibc's debug file), and no function either.
    let (bias, path) = libc_in_self();
    let n = s.user_stack(&[bias + 8]);
    let base = path.file_name().unwrap().to_str().unwrap();
    assert_eq!(names(&n), [format!("{base}+0x8")]);
}

#[test]
fn libc_static_functions_from_debug_file() {
    let (bias, path) = libc_in_self();
    let data = std::fs::read(&path).unwrap();
    let obj = object::File::parse(&*data).unwrap();
    let Some(id) = obj.build_id().unwrap() else {
        return;
    };
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let debug = PathBuf::from(format!(
        "/usr/lib/debug/.build-id/{}/{}.debug",
        &hex[..2],
        &hex[2..]
    ));
    if !debug.is_file() {
        eprintln!(
            "skipped: no debug file for {} (install libc6-dbg)",
            path.display()
        );
        return;
    }
    let ddata = std::fs::read(&debug).unwrap();
    let dobj = object::File::parse(&*ddata).unwrap();
    let mut s = Symbolizer::new(std::process::id()).unwrap();
    let mut checked = 0;
    for name in ["__futex_abstimed_wait_common", "_int_malloc", "_int_free"] {
        let Some(sym) = dobj
            .symbols()
            .find(|s| s.name() == Ok(name) && s.size() > 16)
        else {
            continue;
        };
        // Only the debug file knows it.
        assert!(
            obj.dynamic_symbols().all(|s| s.name() != Ok(name)),
            "{name} is exported"
        );
        let addr = bias + sym.address() + 8;
        // As a return address (the usual case): +1 so that the lookup is at +8.
        let n = s.user_stack(&[0, addr + 1]);
        assert_eq!(&*n[1], name);
        checked += 1;
    }
    assert!(
        checked >= 2,
        "glibc internals not found in {}",
        debug.display()
    );
    assert_eq!(s.stats().errors, 0);
}

#[test]
fn vdso_functions() {
    let base = unsafe { libc::getauxval(libc::AT_SYSINFO_EHDR) };
    if base == 0 {
        return;
    }
    // Size of the vDSO image: its mapping.
    let maps = maps_of(std::process::id());
    let vdso = maps.iter().find(|m| m.path == "[vdso]").unwrap();
    let len = vdso.end - vdso.start;
    let image = unsafe { std::slice::from_raw_parts(base as *const u8, len as usize) };
    let obj = object::File::parse(image).unwrap();
    let sym = obj
        .dynamic_symbols()
        .find(|s| s.name().is_ok_and(|n| n.ends_with("clock_gettime")))
        .expect("clock_gettime in vdso");
    // The vDSO is linked at 0 (or its own base): its symbol values are offsets from the first load segment.
    let first_load = obj
        .segments()
        .next()
        .map(|s| object::ObjectSegment::address(&s))
        .unwrap_or(0);
    let addr = base + (sym.address() - first_load) + 2;
    let mut s = Symbolizer::new(std::process::id()).unwrap();
    let n = s.user_stack(&[addr]);
    assert!(n[0].ends_with("clock_gettime"), "{n:?}");
}

/// Text symbols of the running kernel, sorted by address (empty when addresses are hidden).
fn kallsyms() -> Vec<(u64, String)> {
    let text = std::fs::read_to_string("/proc/kallsyms").unwrap_or_default();
    let mut v: Vec<(u64, String)> = text
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let addr = u64::from_str_radix(f.next()?, 16).ok()?;
            let kind = f.next()?;
            let name = f.next()?;
            (f.next().is_none() && (kind == "T" || kind == "t") && addr != 0)
                .then(|| (addr, name.to_owned()))
        })
        .collect();
    v.sort();
    v
}

#[test]
fn kernel_names_and_return_address_rule() {
    let syms = kallsyms();
    if syms.is_empty() {
        eprintln!("skipped: /proc/kallsyms hides addresses (not root?)");
        return;
    }
    let i = syms
        .iter()
        .position(|(_, n)| n == "schedule")
        .expect("schedule in kallsyms");
    let start = syms[i].0;
    let next = syms[i + 1..].iter().find(|(a, _)| *a > start).unwrap().0;
    let mut s = Symbolizer::new(std::process::id()).unwrap();
    let n = s.kernel_stack(&[start + 1, next]);
    assert_eq!(names(&n), ["schedule_[k]", "schedule_[k]"]);
    // As the leaf (exact IP), `next` belongs to the next function.
    let n = s.kernel_stack(&[next]);
    assert_ne!(&*n[0], "schedule_[k]");
    assert!(n[0].ends_with("_[k]"));
    let n = s.kernel_stack(&[0, 1]);
    assert_eq!(names(&n), ["[unknown]_[k]", "[unknown]_[k]"]);
    assert_eq!(s.stats().kernel_addrs, 4);
}

/// By hand against a real server: `MYPROBE_SYM_PID=<pid> cargo test --release symbolize::tests::manual --
/// --ignored --nocapture`. Prints the cost of new() + a first symbolization of ~1000 addresses spread over the
/// server binary (every n-th FDE start + 3), of a heavy profile (~70,000 unique addresses in stacks of 30), of
/// a first kernel symbolization of ~1000 addresses, of preload(); then the names of the stacks in the file
/// `MYPROBE_SYM_STACKS` (one stack a line, hex addresses leaf first, e.g. from gdb's `thread apply all bt`).
#[test]
#[ignore]
fn manual() {
    let Ok(pid) = std::env::var("MYPROBE_SYM_PID") else {
        return;
    };
    let pid: u32 = pid.parse().unwrap();
    // Addresses: every 40th FDE of the main binary, relocated.
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    let base = maps_of(pid)
        .iter()
        .find(|m| m.path.ends_with(exe.to_str().unwrap()))
        .unwrap()
        .start;
    let eh = elf::EhTable::read(&exe).unwrap();
    let mut addrs: Vec<u64> = eh
        .starts_for_tests()
        .iter()
        .step_by(eh.len() / 1000)
        .map(|a| base + a + 3)
        .collect();
    addrs.truncate(1000);
    let t0 = Instant::now();
    let mut s = Symbolizer::new(pid).unwrap();
    let t_new = t0.elapsed();
    let names1 = s.user_stack(&addrs);
    let t_first = t0.elapsed();
    let _ = s.user_stack(&addrs);
    let t_again = t0.elapsed() - t_first;
    println!(
        "new {:.1} ms, new + first {} addrs {:.1} ms, cached again {:.3} ms; {}",
        t_new.as_secs_f64() * 1e3,
        addrs.len(),
        t_first.as_secs_f64() * 1e3,
        t_again.as_secs_f64() * 1e3,
        s.stats()
    );
    let named = names1.iter().filter(|n| !n.contains("+0x")).count();
    println!(
        "{named} of {} FDE addresses named by a symbol; some:",
        names1.len()
    );
    for n in names1
        .iter()
        .filter(|n| !n.contains("+0x"))
        .step_by(named / 40 + 1)
    {
        println!("  {n}");
    }
    // A heavy profile: 100,000 unique addresses, 50 in each of 2,000 functions, in stacks of 30 frames.
    let ranges = eh.ranges_for_tests();
    let mut heavy = Vec::new();
    for &(start, end) in ranges
        .iter()
        .filter(|r| r.1 - r.0 >= 200)
        .step_by(7)
        .take(2000)
    {
        heavy.extend((0..50).map(|i| base + start + 1 + i * (end - start - 2) / 50));
    }
    let t0 = Instant::now();
    let mut s3 = Symbolizer::new(pid).unwrap();
    let mut n = 0;
    for stack in heavy.chunks(30) {
        n += s3.user_stack(stack).len();
    }
    println!(
        "heavy: {n} frames, {} stacks: {:.1} ms; {}",
        heavy.len().div_ceil(30),
        t0.elapsed().as_secs_f64() * 1e3,
        s3.stats()
    );

    let k = kallsyms();
    let t1 = Instant::now();
    let mut s2 = Symbolizer::new(pid).unwrap();
    let kaddrs: Vec<u64> = k
        .iter()
        .step_by(k.len() / 1000 + 1)
        .map(|(a, _)| a + 1)
        .collect();
    let kn = s2.kernel_stack(&kaddrs);
    println!(
        "kernel: {} addrs in {:.1} ms, e.g. {:?}",
        kaddrs.len(),
        t1.elapsed().as_secs_f64() * 1e3,
        &kn[..4]
    );
    // With preload() done while tracing: what is left after it.
    let t2 = Instant::now();
    let mut s4 = Symbolizer::new(pid).unwrap();
    s4.preload(true);
    let t_pre = t2.elapsed();
    let t3 = Instant::now();
    let _ = s4.kernel_stack(&kaddrs);
    let _ = s4.user_stack(&addrs);
    println!(
        "preload {:.1} ms, then kernel + user first lookups {:.1} ms",
        t_pre.as_secs_f64() * 1e3,
        t3.elapsed().as_secs_f64() * 1e3
    );
    // One stack a line (hex addresses, leaf first): print "address name" lines, a blank line between stacks.
    if let Ok(file) = std::env::var("MYPROBE_SYM_STACKS") {
        for line in std::fs::read_to_string(file).unwrap().lines() {
            let ips: Vec<u64> = line
                .split_whitespace()
                .map(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).unwrap())
                .collect();
            for (ip, n) in ips.iter().zip(s.user_stack(&ips)) {
                println!("{ip:#x} {n}");
            }
            println!();
        }
    }
}

#[test]
fn a_mapping_whose_file_offsets_pass_2_64_names_its_file() {
    let maps = ProcMaps::from_text(
        u32::MAX,
        "1000-3000 r-xp fffffffffffff000 08:01 42 /nonexistent/lib.so\n\
         4000-5000 r-xp 00000000 08:01 43 /nonexistent/b.so\n",
    );
    let mut s = Symbolizer::with_maps(u32::MAX, maps);
    // 0x1fff is the last byte of the file's address space, 0x2000 one past it.
    assert_eq!(
        names(&s.user_stack(&[0x1fff, 0x2001, 0x4100])),
        ["[lib.so]", "[lib.so]", "[b.so]"]
    );
}

/// The C++ fixture `vtables/hidden_overrides.cc` built with `flags` and stripped, started; its unstripped
/// symbols (demangled name → ELF virtual address) and its load bias.
fn start_vtables_fixture(
    name: &str,
    flags: &[&str],
) -> (std::process::Child, PathBuf, HashMap<String, u64>, u64) {
    let dir = build_dir("myprobe-vtables-test-");
    let plain = dir.join(format!("{name}.full"));
    let stripped = dir.join(name);
    if !stripped.exists() {
        let mut cmd = vec!["g++", "-O1", "-g", "-rdynamic", "-fno-inline"];
        cmd.extend(flags);
        let source = fixture_source("vtables/hidden_overrides.cc");
        assert!(compile(&cmd, &source, &plain, &[]), "g++ failed");
        run(
            "strip",
            &[
                "--strip-all".as_ref(),
                "-o".as_ref(),
                stripped.as_os_str(),
                plain.as_os_str(),
            ],
        );
    }
    let data = std::fs::read(&plain).unwrap();
    let obj = object::File::parse(&*data).unwrap();
    let syms: HashMap<String, u64> = obj
        .symbols()
        .filter_map(|s| {
            let raw = s.name().ok()?;
            let d = cpp_demangle::Symbol::new(raw).ok()?.demangle().ok()?;
            Some((clean_name(&d)?, s.address()))
        })
        .collect();
    let lowest = object::ObjectSegment::address(&obj.segments().next().unwrap()) & !0xfff;
    let mut child = Command::new(&stripped)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "ready");
    let start = maps_of(child.id())
        .iter()
        .filter(|m| m.offset == 0 && Path::new(&m.path) == stripped)
        .map(|m| m.start)
        .min()
        .unwrap();
    (child, stripped, syms, start - lowest)
}

#[test]
fn virtual_methods_without_symbols_are_named_from_vtables() {
    for (name, flags) in [
        ("hidden_overrides", &["-fPIE", "-pie"][..]),
        ("hidden_overrides_nopie", &["-no-pie"][..]),
    ] {
        let (mut child, stripped, syms, bias) = start_vtables_fixture(name, flags);
        let mut s = Symbolizer::new(child.id()).unwrap();
        let anon = "(anonymous namespace)";
        let expected = [
            // A hidden override in an exported vtable.
            ("Exported::work".to_string(), "Exported::work".to_string()),
            // Vtables that are not exported at all, their slots named after Base's.
            (
                format!("{anon}::Hidden::work"),
                format!("{anon}::Hidden::work"),
            ),
            (
                format!("{anon}::Hidden::other"),
                format!("{anon}::Hidden::other"),
            ),
            (
                format!("{anon}::Hidden::~Hidden"),
                format!("{anon}::Hidden::~Hidden"),
            ),
            // Through Hidden's slot, which is unnamed too, up to Base's.
            (
                format!("{anon}::Deeper::other"),
                format!("{anon}::Deeper::other"),
            ),
            // Exported symbols are the symbols' names.
            ("Base::work".to_string(), "Base::work".to_string()),
        ];
        for (symbol, frame) in expected {
            let vaddr = syms[&symbol];
            assert_eq!(
                names(&s.user_stack(&[bias + vaddr + 2])),
                [frame.as_str()],
                "{name}: {symbol} at {vaddr:#x}"
            );
        }
        // No vtable holds spin: it keeps its .eh_frame name.
        let base = stripped.file_name().unwrap().to_str().unwrap();
        assert_eq!(
            names(&s.user_stack(&[bias + syms["spin"] + 2])),
            [format!("{base}+0x{:x}", syms["spin"])]
        );
        let st = s.stats();
        assert_eq!(st.from_vtables, 5, "{name}: {st}");
        assert_eq!(st.errors, 0, "{st}");
        let _ = child.kill();
        let _ = child.wait();
    }
}
