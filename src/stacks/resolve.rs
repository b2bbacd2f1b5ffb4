//! `myprobe stacks --resolve`: stack text (a server's crash report, gdb, eu-stack or pstack output, bare
//! addresses) made into clean stacks. Each raw address is resolved against the module the text names, placed
//! where the text shows it was loaded (`mariadbd(+0xaed67e)[0x5580ef4c467e]` gives both); names are demangled,
//! offsets and arguments dropped; a crash's identifying elements are named in one line.

use std::{
    collections::HashMap,
    fmt::Write as _,
    path::{Path, PathBuf},
};

use anyhow::Result;

use super::{
    text::{self, CrashInfo, TextFrame},
    ThreadStack,
};
use crate::{
    process::maps::ProcMaps,
    symbolize::{elf::Segment, unnamed_in_binary, Symbolizer},
};

/// The stacks of a text, named.
pub struct Resolved {
    pub threads: Vec<ThreadStack>,
    pub crash: CrashInfo,
    /// The identifying elements of the crash (of the first thread in a signal handler), one line; empty
    /// without a crash.
    pub summary: String,
    /// What could not be resolved, for stderr.
    pub warnings: Vec<String>,
}

/// Where the server binaries are installed, for a report that names only `mariadbd` or `mysqld`.
const SERVER_DIRS: [&str; 4] = [
    "/usr/sbin",
    "/usr/libexec",
    "/usr/bin",
    "/usr/local/mysql/bin",
];

/// Parses `text` (named `name` in messages) and names its frames; `exe` is the server binary, when the text
/// names it without a path or at another one; `root` the filesystem the server ran in (a container's).
pub fn resolve(
    text: &str,
    name: &str,
    exe: Option<&Path>,
    root: Option<&Path>,
) -> Result<Resolved> {
    let parsed = text::parse(text, name)?;
    let mut warnings = Vec::new();
    let mut modules = Modules::place(&parsed.threads, exe, root, &mut warnings);
    if modules.placed.is_empty() && parsed.crash.format.contains("crash report") {
        modules = Modules::infer(&parsed, exe, root, &mut warnings);
    }
    let mut symbolizer = Symbolizer::of_maps(modules.maps());
    let (mut named, mut disagree) = (0, Vec::new());
    let mut threads: Vec<ThreadStack> = parsed
        .threads
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let frames = t
                .frames
                .iter()
                .map(|f| {
                    let given = f.clean_function();
                    let ours = f
                        .addr
                        .filter(|_| modules.holds(f))
                        .map(|a| {
                            let lookup = if f.is_return_address {
                                a.saturating_sub(1)
                            } else {
                                a
                            };
                            symbolizer.user_stack(&[lookup])[0].to_string()
                        })
                        .filter(|n| !n.starts_with('['));
                    if let (Some(g), Some(o)) = (&given, &ours) {
                        named += 1;
                        if unnamed_in_binary(o).is_none() && g != o {
                            disagree.push(format!("{g} / {o}"));
                        }
                    }
                    // A name from the binary's symbols, else the text's, else the address's place.
                    match (ours, given) {
                        (Some(o), _) if unnamed_in_binary(&o).is_none() => o,
                        (_, Some(g)) => g,
                        (Some(o), None) => o,
                        (None, None) => unnamed(f),
                    }
                })
                .collect();
            // A crash report's one thread is the one that crashed; other texts' threads are named as they give.
            let name = match (&t.name, t.tid) {
                (Some(n), _) => n.clone(),
                (None, _) if parsed.crash.format.contains("crash report") => {
                    "(crashed)".to_string()
                }
                (None, Some(_)) => String::new(),
                (None, None) => format!("(thread {})", t.label),
            };
            ThreadStack {
                tid: t.tid.unwrap_or(i as u32 + 1),
                name,
                state: None,
                running: false,
                syscall: None,
                idle_ms: None,
                waits: None,
                statement: None,
                cause: None,
                frames,
            }
        })
        .collect();
    // Frames named by the text but otherwise by the binary: another build than the one that crashed.
    if disagree.len() * 2 > named && named > 0 {
        warnings.push(format!(
            "{} of the {named} frames the text names are other functions in the binaries found here ({}): they \
             are not the binaries that wrote it; give the server's with --exe",
            disagree.len(),
            disagree.iter().take(2).cloned().collect::<Vec<_>>().join("; ")
        ));
    }
    if let (Some(q), Some(first)) = (&parsed.crash.query, threads.first_mut()) {
        first.statement = Some(q.clone());
    }
    // What identifies a crash: of a crash report's thread, or of the first thread in a signal handler.
    let crashed = |t: &&ThreadStack| {
        parsed.crash.format.contains("crash report")
            || t.frames
                .iter()
                .any(|f| f == "__restore_rt" || f.contains("signal handler called"))
    };
    let summary = threads
        .iter()
        .find(crashed)
        .map(|t| {
            let frames: Vec<&str> = t.frames.iter().map(String::as_str).collect();
            let elements = text::identify(&frames);
            let site = text::crash_site(&frames).and_then(|i| frames.get(i).copied());
            text::summary_line(&elements, &parsed.crash, site)
        })
        .unwrap_or_default();
    Ok(Resolved {
        threads,
        crash: parsed.crash,
        summary,
        warnings,
    })
}

/// A frame with no name from anywhere: its module and offset, or its address.
fn unnamed(f: &TextFrame) -> String {
    let module = f
        .module
        .as_deref()
        .map(|m| m.rsplit('/').next().unwrap_or(m));
    match (module, f.module_offset, f.addr) {
        (Some(m), Some(off), _) => format!("{m}+{off:#x}"),
        (Some(m), None, _) => format!("[{m}]"),
        (None, _, Some(a)) => format!("{a:#x}"),
        (None, _, None) => "[unknown]".to_string(),
    }
}

/// The modules of a text placed where they were loaded, as maps for the symbolizer.
struct Modules {
    /// (module name as the text gives it) → (file, load base).
    placed: HashMap<String, (PathBuf, u64)>,
}

impl Modules {
    /// Finds each module's file and load base (a frame that gives both its offset in the module and its address).
    fn place(
        threads: &[text::TextThread],
        exe: Option<&Path>,
        root: Option<&Path>,
        warnings: &mut Vec<String>,
    ) -> Self {
        let mut bases: HashMap<&str, u64> = HashMap::new();
        for f in threads.iter().flat_map(|t| &t.frames) {
            if let (Some(m), Some(off), Some(a)) = (&f.module, f.module_offset, f.addr) {
                bases.entry(m.as_str()).or_insert(a.wrapping_sub(off));
            }
        }
        let mut placed = HashMap::new();
        let mut missing = Vec::new();
        for (module, base) in bases {
            match find_module(module, exe, root) {
                Some(path) => {
                    placed.insert(module.to_string(), (path, base));
                }
                None => missing.push(module.to_string()),
            }
        }
        if !missing.is_empty() {
            missing.sort();
            warnings.push(format!(
                "not found on this machine, their raw addresses stay unnamed: {} (give the server binary with --exe)",
                missing.join(", ")
            ));
        }
        Modules { placed }
    }

    /// Places the binaries of a text whose frames give absolute addresses and names but no module (MySQL's
    /// libbacktrace report): the server binary (checked against the report's build-id) and the libraries it
    /// needs, each where the addresses of the functions it defines fall inside them.
    fn infer(
        parsed: &text::ParsedText,
        exe: Option<&Path>,
        root: Option<&Path>,
        warnings: &mut Vec<String>,
    ) -> Self {
        let mut placed = HashMap::new();
        let frames: Vec<&TextFrame> = parsed
            .threads
            .iter()
            .flat_map(|t| &t.frames)
            .filter(|f| f.module.is_none() && f.addr.is_some())
            .collect();
        if !frames.iter().any(|f| f.function.is_some()) {
            return Modules { placed };
        }
        let program = parsed.crash.program.as_deref().unwrap_or("mysqld");
        let Some(server) = find_module(program, exe, root) else {
            warnings.push(format!(
                "{program} is not found on this machine{}: the raw addresses stay unnamed (give the server \
                 binary with --exe, or the filesystem it ran in with --root)",
                root.map(|r| format!(" under {}", r.display())).unwrap_or_default()
            ));
            return Modules { placed };
        };
        if let Some(theirs) = &parsed.crash.build_id {
            let ours = super::core::build_id_of(&server)
                .ok()
                .flatten()
                .map(|id| super::core::hex(&id));
            if ours.as_deref() != Some(theirs.as_str()) {
                warnings.push(format!(
                    "{} is another build than the server that crashed (build-id {}, the report's {theirs}): the \
                     raw addresses stay unnamed (give the server binary with --exe, or the filesystem it ran in \
                     with --root)",
                    server.display(),
                    ours.as_deref().unwrap_or("none")
                ));
                return Modules { placed };
            }
        }
        let mut files = vec![server.clone()];
        if let Ok(data) = std::fs::read(&server) {
            files.extend(needed_libraries(&data).iter().filter_map(|lib| {
                LIBRARY_DIRS
                    .iter()
                    .map(|d| super::file_under(root, &Path::new(d).join(lib)))
                    .find(|p| p.is_file())
            }));
        }
        for file in files {
            let Ok(data) = std::fs::read(&file) else {
                continue;
            };
            let Ok(obj) = object::File::parse(&*data) else {
                continue;
            };
            let functions = function_symbols(&obj);
            let spans: Vec<(u64, u64, u64)> = frames
                .iter()
                .filter_map(|f| {
                    let name = text::strip_symbol_version(f.function.as_deref()?);
                    let &(start, size) = functions.get(name)?;
                    Some((f.addr?, start, size))
                })
                .collect();
            // A library is not checked by build-id: this machine's own (no --root, which names the server's
            // files) is placed only where two of its functions agree.
            if spans.is_empty() || (file != server && root.is_none() && spans.len() < 2) {
                continue;
            }
            match load_bias(&spans) {
                Some(bias) => {
                    placed.insert(file.display().to_string(), (file, bias));
                }
                None => warnings.push(format!(
                    "the addresses of {}'s functions in the text do not fit one place it was loaded at: its \
                     frames stay as the text names them",
                    file.display()
                )),
            }
        }
        Modules { placed }
    }

    /// Whether frame `f`'s address can be looked up: its module is placed, or (no module named: gdb, eu-stack
    /// text) it falls in a placed module.
    fn holds(&self, f: &TextFrame) -> bool {
        match &f.module {
            Some(m) => self.placed.contains_key(m),
            None => !self.placed.is_empty(),
        }
    }

    /// Each placed module's loadable segments at its base, as a process's maps would show them.
    fn maps(&self) -> ProcMaps {
        use std::os::unix::fs::MetadataExt;
        let mut text = String::new();
        let mut lines: Vec<(u64, String)> = Vec::new();
        for (path, base) in self.placed.values() {
            let Ok(data) = std::fs::read(path) else {
                continue;
            };
            let Ok(obj) = object::File::parse(&*data) else {
                continue;
            };
            let inode = std::fs::metadata(path).map_or(1, |m| m.ino().max(1));
            for s in Segment::all(&obj) {
                let start = base.wrapping_add(s.vaddr & !0xfff);
                let end =
                    base.wrapping_add(s.vaddr.wrapping_add(s.memsz).wrapping_add(0xfff) & !0xfff);
                lines.push((
                    start,
                    format!(
                        "{start:x}-{end:x} r{}{}p {:x} 00:00 {inode} {}",
                        if s.writable { 'w' } else { '-' },
                        if s.exec { 'x' } else { '-' },
                        s.offset & !0xfff,
                        path.display()
                    ),
                ));
            }
        }
        lines.sort();
        for (_, l) in lines {
            let _ = writeln!(text, "{l}");
        }
        ProcMaps::fixed(&text, HashMap::new())
    }
}

/// Where a server's libraries are installed (Debian's and Red Hat's).
const LIBRARY_DIRS: [&str; 5] = [
    "/usr/lib/x86_64-linux-gnu",
    "/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/lib64",
    "/usr/lib",
];

/// The libraries an ELF file names as needed (`DT_NEEDED`).
fn needed_libraries(data: &[u8]) -> Vec<String> {
    use object::read::elf::{Dyn as _, FileHeader as _};
    let needed = || -> Option<Vec<String>> {
        let header = object::elf::FileHeader64::<object::Endianness>::parse(data).ok()?;
        let endian = header.endian().ok()?;
        let sections = header.sections(endian, data).ok()?;
        let (dynamic, link) = sections.dynamic(endian, data).ok()??;
        let strings = sections.strings(endian, data, link).ok()?;
        Some(
            dynamic
                .iter()
                .filter(|d| d.tag32(endian) == Some(object::elf::DT_NEEDED))
                .filter_map(|d| d.string(endian, strings).ok())
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect(),
        )
    };
    needed().unwrap_or_default()
}

/// Functions by their symbol name (mangled, as libbacktrace prints them): start and size.
fn function_symbols<'a>(obj: &'a object::File<'a>) -> HashMap<&'a str, (u64, u64)> {
    use object::{Object as _, ObjectSymbol as _};
    obj.symbols()
        .chain(obj.dynamic_symbols())
        .filter(|s| s.kind() == object::SymbolKind::Text && s.size() > 0 && s.address() > 0)
        .filter_map(|s| Some((s.name().ok()?, (s.address(), s.size()))))
        .collect()
}

/// The load bias (page-aligned, as the loader places a binary) that puts the most of `spans`' addresses inside
/// their functions, each `(address, function start, function size)`; None when no bias fits two of them, or
/// the only one, exactly.
fn load_bias(spans: &[(u64, u64, u64)]) -> Option<u64> {
    const PAGE: u64 = 0x1000;
    let mut votes: HashMap<u64, usize> = HashMap::new();
    for &(addr, start, size) in spans {
        // addr - bias in [start, start + size): bias in (addr - start - size, addr - start].
        let high = addr.checked_sub(start)?;
        let low = high.saturating_sub(size - 1);
        let mut bias = low.div_ceil(PAGE) * PAGE;
        // A huge function leaves many pages: it tells nothing.
        for _ in 0..64 {
            if bias > high {
                break;
            }
            *votes.entry(bias).or_default() += 1;
            bias += PAGE;
        }
    }
    let best = votes.values().copied().max()?;
    let mut winners = votes.iter().filter(|(_, &v)| v == best);
    let (&bias, _) = winners.next()?;
    let unique = winners.next().is_none();
    (unique && (best >= 2 || spans.len() == 1)).then_some(bias)
}

/// The file of a module the text names: its path if it is one (under `root`), the server binary (`--exe`, or
/// where servers are installed) for a bare name.
fn find_module(module: &str, exe: Option<&Path>, root: Option<&Path>) -> Option<PathBuf> {
    let path = Path::new(module);
    let file_name = path.file_name()?;
    if let Some(exe) = exe {
        if exe.file_name() == Some(file_name) || !module.contains('/') {
            return Some(exe.to_path_buf());
        }
    }
    if path.is_absolute() {
        let path = super::file_under(root, path);
        return path.is_file().then_some(path);
    }
    SERVER_DIRS
        .iter()
        .map(|d| super::file_under(root, &Path::new(d).join(file_name)))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::load_bias;

    #[test]
    fn a_binary_is_placed_where_its_functions_hold_their_addresses() {
        let bias = 0x557ff2e00000;
        // (address, function start, size): three frames of one binary, and one that says nothing alone.
        let spans = [
            (bias + 0x17102cf, 0x1710280, 0x100),
            (bias + 0x17105e2, 0x1710500, 0x200),
            (bias + 0x131d3bc, 0x131d000, 0x500),
            (bias + 0x5000000, 0x4ff0000, 0x200000),
        ];
        assert_eq!(load_bias(&spans), Some(bias));
        // One frame alone: placed only when one page fits.
        assert_eq!(load_bias(&spans[..1]), Some(bias));
        assert_eq!(load_bias(&spans[3..]), None);
        // Two frames that fit no common place: none.
        let apart = [
            (bias + 0x17102cf, 0x1710280, 0x100),
            (bias + 0x17102cf + 0x5000, 0x1710280, 0x100),
        ];
        assert_eq!(load_bias(&apart), None);
        // An address before its function's start: no bias at all.
        assert_eq!(load_bias(&[(0x10, 0x20, 0x10)]), None);
    }
}
