//! Finding probe points in a server binary by *demangled* name, so that one build's mangling (or a
//! signature that changed between versions) never breaks a probe: `dispatch_command(` matches
//! `_Z16dispatch_command19enum_server_commandP3THDPcjb` (MariaDB) and
//! `_Z16dispatch_commandP3THDPK8COM_DATA19enum_server_command` (MySQL) alike.

use std::path::Path;

use anyhow::{Context, Result};
use object::{Object, ObjectSymbol, SymbolKind};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Function {
    /// The name in the symbol table, as the uprobe attach takes it.
    pub mangled: String,
    /// `dispatch_command(enum_server_command, THD*, char*, unsigned int, bool)`
    pub demangled: String,
}

/// The first function of `binary` whose demangled name starts with `prefix` (e.g. `dispatch_command(`),
/// from `.symtab` or `.dynsym`; `None` if the binary has no such symbol (stripped, or another version).
pub fn find_function(binary: &Path, prefix: &str) -> Result<Option<Function>> {
    let data = std::fs::read(binary).with_context(|| format!("reading {}", binary.display()))?;
    let file = object::File::parse(&*data).with_context(|| format!("{} is not an ELF file", binary.display()))?;
    // The plain identifier appears in the mangled name (as `16dispatch_command`), which avoids demangling
    // tens of thousands of symbols.
    let ident = prefix.trim_end_matches('(').rsplit("::").next().unwrap_or(prefix);
    let candidates = file.symbols().chain(file.dynamic_symbols());
    for sym in candidates {
        if sym.kind() != SymbolKind::Text || sym.address() == 0 {
            continue;
        }
        let Ok(name) = sym.name() else { continue };
        if !name.contains(ident) {
            continue;
        }
        let demangled = demangle(name);
        if demangled.starts_with(prefix) {
            return Ok(Some(Function { mangled: name.to_string(), demangled }));
        }
    }
    Ok(None)
}

fn demangle(name: &str) -> String {
    cpp_demangle::Symbol::new(name)
        .ok()
        .and_then(|s| s.demangle().ok())
        .unwrap_or_else(|| name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_functions_by_demangled_name() {
        // The test binary itself: a Rust function is not C++, so look for a libc-style C symbol instead.
        let exe = std::env::current_exe().unwrap();
        let f = find_function(&exe, "main").unwrap().expect("the test binary has a main");
        assert_eq!(f.mangled, "main");
        assert!(find_function(&exe, "no_such_function_anywhere(").unwrap().is_none());
        assert!(find_function(Path::new("/nonexistent"), "x").is_err());
    }

    #[test]
    fn demangles_server_signatures() {
        assert_eq!(
            demangle("_Z16dispatch_command19enum_server_commandP3THDPcjb"),
            "dispatch_command(enum_server_command, THD*, char*, unsigned int, bool)"
        );
        assert!(demangle("_Z16dispatch_commandP3THDPK8COM_DATA19enum_server_command").starts_with("dispatch_command(THD*"));
    }
}
