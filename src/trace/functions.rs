//! The functions of the traced process by demangled name or glob, in the server and its libraries: what
//! `myprobe trace FUNC` probes and `--list PATTERN` shows.
//!
//! A module's functions are its symbols (`.symtab`, `.dynsym`, and a debug file's `.symtab` when one is on
//! this machine), and, for a stripped C++ server, the virtual methods its vtables name (Debian's `mariadbd`
//! exports `handler::write_row` but not `ha_innobase::write_row`). Aliases (one address, several names) are
//! one function.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use anyhow::{bail, Context, Result};
use globset::{GlobBuilder, GlobMatcher};
use object::{Object, ObjectSymbol, SymbolKind};

use crate::{
    process::{
        maps::ProcMaps,
        probes::{demangle, entry_probe_at, EntryProbe},
    },
    symbolize::{
        clean::matching_open_paren,
        elf::{EhTable, ElfInfo},
        vtables::VtableNames,
    },
};

/// A function of a module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Function {
    /// Demangled, with its parameters: `ha_innobase::write_row(unsigned char const*)`.
    pub name: String,
    /// ELF virtual address and size in bytes.
    pub address: u64,
    pub size: u64,
}

impl Function {
    /// The name without its parameters: `ha_innobase::write_row`.
    pub fn short(&self) -> &str {
        short_name(&self.name)
    }
}

/// `a::b(int) const` → `a::b`; a name without parameters is itself.
pub fn short_name(name: &str) -> &str {
    let Some(close) = name.rfind(')') else {
        return name;
    };
    let qualifiers = name[close + 1..]
        .split_whitespace()
        .all(|w| matches!(w, "const" | "volatile" | "&" | "&&" | "noexcept"));
    if !qualifiers {
        return name;
    }
    matching_open_paren(&name[..=close]).map_or(name, |open| &name[..open])
}

/// A file the process maps, with its functions.
pub struct Module {
    /// How the process names it (for people).
    pub path: PathBuf,
    /// Where it is read and probed.
    pub open_path: PathBuf,
    /// `mariadbd`, `libc.so.6`.
    pub basename: String,
    pub functions: Vec<Function>,
}

impl Module {
    /// Reads the functions of `open_path`; `vtables`: also name virtual methods from its vtables (C++).
    pub fn read(path: &Path, open_path: &Path, vtables: bool) -> Result<Module> {
        let data =
            std::fs::read(open_path).with_context(|| format!("reading {}", open_path.display()))?;
        let file = object::File::parse(&*data)
            .with_context(|| format!("{} is not an ELF file", path.display()))?;
        let mut by_address: HashMap<u64, Function> = HashMap::new();
        let mut add = |name: &str, address: u64, size: u64| {
            if address == 0 || name.is_empty() {
                return;
            }
            let f = by_address.entry(address).or_insert_with(|| Function {
                name: demangle(name),
                address,
                size,
            });
            f.size = f.size.max(size);
        };
        for sym in file.symbols().chain(file.dynamic_symbols()) {
            if sym.kind() == SymbolKind::Text {
                if let Ok(name) = sym.name() {
                    add(name, sym.address(), sym.size());
                }
            }
        }
        // A stripped file's debug file, when this machine has one: every function, static ones included.
        let info = ElfInfo::read(open_path, path, &[]).ok();
        if let Some((debug, true)) = info.as_ref().and_then(|i| i.debug_file.clone()) {
            if let Ok(debug_data) = std::fs::read(&debug) {
                if let Ok(debug_file) = object::File::parse(&*debug_data) {
                    for sym in debug_file.symbols() {
                        if sym.kind() == SymbolKind::Text {
                            if let Ok(name) = sym.name() {
                                add(name, sym.address(), sym.size());
                            }
                        }
                    }
                }
            }
        }
        if vtables {
            let names = VtableNames::read(open_path).unwrap_or_default();
            let eh = EhTable::read(open_path).unwrap_or_default();
            for (address, name) in names.iter() {
                if by_address.contains_key(&address) {
                    continue;
                }
                let size = eh
                    .find(address)
                    .filter(|&(start, _)| start == address)
                    .map_or(0, |(start, end)| end - start);
                by_address.insert(
                    address,
                    Function {
                        name: name.to_string(),
                        address,
                        size,
                    },
                );
            }
        }
        let mut functions: Vec<Function> = by_address.into_values().collect();
        functions.sort_by(|a, b| a.name.cmp(&b.name).then(a.address.cmp(&b.address)));
        Ok(Module {
            path: path.to_path_buf(),
            open_path: open_path.to_path_buf(),
            basename: path
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
            functions,
        })
    }

    /// The entry probes of `functions` (of this module), as `entry_probe_at` places them.
    pub fn entry_probes(&self, functions: &[&Function]) -> Result<Vec<Option<EntryProbe>>> {
        let data = std::fs::read(&self.open_path)
            .with_context(|| format!("reading {}", self.open_path.display()))?;
        let file = object::File::parse(&*data)
            .with_context(|| format!("{} is not an ELF file", self.path.display()))?;
        Ok(functions
            .iter()
            .map(|f| entry_probe_at(&file, f.address, f.size))
            .collect())
    }
}

/// A function pattern as given: `[MODULE:]NAME_OR_GLOB`.
#[derive(Debug, PartialEq, Eq)]
pub struct Spec<'a> {
    /// `libc` in `libc:malloc`; `None`: the server's executable.
    pub module: Option<&'a str>,
    pub pattern: &'a str,
}

impl<'a> Spec<'a> {
    /// A `MODULE:` prefix is a single colon; C++'s `::` is part of the name.
    pub fn parse(spec: &'a str) -> Spec<'a> {
        let bytes = spec.as_bytes();
        let single = (0..bytes.len()).find(|&i| {
            bytes[i] == b':' && bytes.get(i + 1) != Some(&b':') && (i == 0 || bytes[i - 1] != b':')
        });
        match single {
            Some(i) if i > 0 && !spec[..i].contains("::") => Spec {
                module: Some(&spec[..i]),
                pattern: &spec[i + 1..],
            },
            _ => Spec {
                module: None,
                pattern: spec,
            },
        }
    }
}

/// Whether `basename` is the module a user names `name`: `libc` is `libc.so.6`, `libpthread` is
/// `libpthread-2.31.so`, and a full name is itself.
pub fn module_matches(basename: &str, name: &str) -> bool {
    basename == name
        || basename
            .strip_prefix(name)
            .is_some_and(|rest| rest.starts_with(".so") || rest.starts_with('-'))
        || basename
            .strip_prefix("lib")
            .and_then(|b| b.strip_prefix(name))
            .is_some_and(|rest| rest.starts_with(".so") || rest.starts_with('-'))
}

/// A name pattern: a glob (`*`, `?`, `[…]`) or an exact name, matched against the name without its
/// parameters, or with them when the pattern has a `(`.
pub struct Pattern {
    glob: GlobMatcher,
    with_parameters: bool,
}

impl Pattern {
    pub fn new(pattern: &str) -> Result<Pattern> {
        let glob = GlobBuilder::new(pattern)
            .literal_separator(false)
            .backslash_escape(true)
            .build()
            .with_context(|| format!("{pattern:?} is not a valid name or glob"))?;
        Ok(Pattern {
            glob: glob.compile_matcher(),
            with_parameters: pattern.contains('('),
        })
    }

    pub fn matches(&self, f: &Function) -> bool {
        if self.with_parameters {
            self.glob.is_match(&f.name)
        } else {
            self.glob.is_match(f.short())
        }
    }
}

/// The modules of process `pid` a spec may name: the executable (`exe`, its `open` path), and the libraries
/// it maps, read lazily.
pub struct Modules {
    exe: (PathBuf, PathBuf),
    libraries: Vec<(PathBuf, PathBuf, String)>,
    read: HashMap<PathBuf, Module>,
}

impl Modules {
    pub fn of_process(pid: u32, exe: &Path, exe_open: &Path) -> Result<Modules> {
        let maps = ProcMaps::read(pid).context("reading the process's memory map")?;
        let libraries = maps
            .files_in_address_order()
            .into_iter()
            .filter(|f| f.symbolic != exe && f.basename.contains(".so"))
            .map(|f| (f.symbolic.clone(), f.open_path.clone(), f.basename.clone()))
            .collect();
        Ok(Modules {
            exe: (exe.to_path_buf(), exe_open.to_path_buf()),
            libraries,
            read: HashMap::new(),
        })
    }

    /// The module a spec names; an error naming the libraries there are when none matches.
    pub fn module(&mut self, name: Option<&str>) -> Result<&Module> {
        let exe_name = self
            .exe
            .0
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let (path, open, vtables) = match name {
            None => (self.exe.0.clone(), self.exe.1.clone(), true),
            Some(n) if n == exe_name => (self.exe.0.clone(), self.exe.1.clone(), true),
            Some(n) => {
                let found = self
                    .libraries
                    .iter()
                    .find(|(_, _, base)| module_matches(base, n));
                let Some((path, open, _)) = found else {
                    let names: Vec<&str> =
                        self.libraries.iter().map(|(_, _, b)| b.as_str()).collect();
                    bail!(
                        "the process maps no library {n:?}: it has {exe_name} and {}",
                        names.join(", ")
                    );
                };
                (path.clone(), open.clone(), false)
            }
        };
        if !self.read.contains_key(&path) {
            let module = Module::read(&path, &open, vtables)?;
            self.read.insert(path.clone(), module);
        }
        Ok(&self.read[&path])
    }
}

/// The functions of `module` a pattern matches; an error in one line, with the closest names, when none.
pub fn matching<'m>(module: &'m Module, pattern: &str) -> Result<Vec<&'m Function>> {
    let p = Pattern::new(pattern)?;
    let found: Vec<&Function> = module.functions.iter().filter(|f| p.matches(f)).collect();
    if found.is_empty() {
        let closest = closest_names(module, pattern, 5);
        let hint = if closest.is_empty() {
            String::new()
        } else {
            format!("; the closest: {}", closest.join(", "))
        };
        bail!(
            "no function {pattern:?} in {} ({} functions named there){hint}. `myprobe trace --list 'PATTERN'` \
             lists them",
            module.basename,
            module.functions.len()
        );
    }
    Ok(found)
}

/// The `n` names of `module` closest to `wanted` (without parameters, each once).
pub fn closest_names(module: &Module, wanted: &str, n: usize) -> Vec<String> {
    let wanted = short_name(wanted);
    let mut scored: Vec<(f64, &str)> = module
        .functions
        .iter()
        .map(|f| f.short())
        .map(|name| (strsim::jaro_winkler(wanted, name), name))
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(b.1)));
    let mut names: Vec<String> = Vec::new();
    for (score, name) in scored {
        if names.len() == n || score < 0.7 {
            break;
        }
        if !names.iter().any(|x| x == name) {
            names.push(name.to_string());
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_split_a_module_prefix_from_cpp_names() {
        assert_eq!(
            Spec::parse("libc:malloc"),
            Spec {
                module: Some("libc"),
                pattern: "malloc"
            }
        );
        assert_eq!(Spec::parse("ha_innobase::write_row").module, None);
        assert_eq!(
            Spec::parse("mariadbd:ha_innobase::write_row"),
            Spec {
                module: Some("mariadbd"),
                pattern: "ha_innobase::write_row"
            }
        );
        assert_eq!(Spec::parse("row_ins_*").module, None);
        assert_eq!(Spec::parse("::global").module, None);
    }

    #[test]
    fn modules_match_by_their_short_names() {
        assert!(module_matches("libc.so.6", "libc"));
        assert!(module_matches("libc.so.6", "c"));
        assert!(module_matches("libc.so.6", "libc.so.6"));
        assert!(module_matches("libpthread-2.31.so", "pthread"));
        assert!(!module_matches("libcrypt.so.1", "libc"));
        assert!(!module_matches("libcrypto.so.3", "libc"));
    }

    #[test]
    fn short_names_drop_parameters_and_qualifiers() {
        assert_eq!(
            short_name("ha_innobase::write_row(unsigned char const*)"),
            "ha_innobase::write_row"
        );
        assert_eq!(short_name("THD::awake(killed_state) const"), "THD::awake");
        assert_eq!(short_name("malloc"), "malloc");
        assert_eq!(short_name("operator()(int)"), "operator()");
    }

    fn module(names: &[&str]) -> Module {
        Module {
            path: "/x/mariadbd".into(),
            open_path: "/x/mariadbd".into(),
            basename: "mariadbd".into(),
            functions: names
                .iter()
                .enumerate()
                .map(|(i, n)| Function {
                    name: n.to_string(),
                    address: 0x1000 + i as u64,
                    size: 1,
                })
                .collect(),
        }
    }

    #[test]
    fn patterns_are_globs_or_exact_names() {
        let m = module(&[
            "ha_innobase::write_row(unsigned char const*)",
            "ha_innobase::update_row(unsigned char const*, unsigned char const*)",
            "row_ins_clust_index_entry(dict_index_t*, dtuple_t*, que_thr_t*, unsigned long)",
            "row_ins_sec_index_entry(dict_index_t*, dtuple_t*, que_thr_t*, bool)",
            "my_thread_setprio",
        ]);
        let names = |p: &str| -> Vec<String> {
            matching(&m, p)
                .unwrap()
                .iter()
                .map(|f| f.short().to_string())
                .collect()
        };
        assert_eq!(names("ha_innobase::write_row"), ["ha_innobase::write_row"]);
        assert_eq!(names("row_ins_*").len(), 2);
        assert_eq!(names("ha_innobase::*_row").len(), 2);
        assert_eq!(
            names("*(dict_index_t*, dtuple_t*, que_thr_t*, bool)").len(),
            1
        );
        let err = matching(&m, "ha_innobase::write_ro")
            .unwrap_err()
            .to_string();
        assert!(err.contains("the closest: ha_innobase::write_row"), "{err}");
        assert!(!err.contains('\n'));
    }
}
