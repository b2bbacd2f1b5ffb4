//! Which probe points a list of specs names: functions by demangled name or glob, in the server or a library it
//! maps (`libc:malloc`), and static probes (`usdt:PROVIDER:NAME`), each function once.

use std::{collections::HashMap, path::PathBuf};

use anyhow::{bail, Context, Result};

use super::{
    functions::{self, Modules, Spec},
    usdt,
};
use crate::{
    collect::trace::{Place, ProbePoint},
    process::{maps::ProcMaps, Target},
};

/// The most probes one run places (the BPF side's MAX_FUNCS).
const MAX_PROBES: usize = 1024;

/// Splits a list of specs on the commas outside parentheses (a parameter list has its own).
fn split_specs(list: &str) -> Vec<&str> {
    let mut specs = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in list.char_indices() {
        match c {
            '(' | '<' => depth += 1,
            ')' | '>' => depth -= 1,
            ',' if depth <= 0 => {
                specs.push(list[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    specs.push(list[start..].trim());
    specs.retain(|s| !s.is_empty());
    specs
}

/// The probes the specs name, each function once; an error in one line for a name that is nowhere.
pub fn resolve(target: &Target, modules: &mut Modules, list: &str) -> Result<Vec<ProbePoint>> {
    let mut probes: Vec<ProbePoint> = Vec::new();
    let mut seen: Vec<(PathBuf, u64)> = Vec::new();
    for spec in split_specs(list) {
        if let Some(rest) = spec.strip_prefix("usdt:") {
            probes.extend(usdt_probes(target, rest)?);
            continue;
        }
        let s = Spec::parse(spec);
        let module = modules.module(s.module)?;
        let found = functions::matching(module, s.pattern)?;
        let places = module.entry_probes(&found)?;
        let prefix = s.module.map(|m| format!("{m}:")).unwrap_or_default();
        // Overloads share a short name: they are told apart by their parameters.
        let mut shorts: HashMap<&str, usize> = HashMap::new();
        for f in &found {
            *shorts.entry(f.short()).or_default() += 1;
        }
        for (f, place) in found.iter().zip(places) {
            let Some(place) = place else {
                say!(
                    "myprobe: note: {} has no code in {} to probe: left out",
                    f.name,
                    module.basename
                );
                continue;
            };
            if seen.contains(&(module.open_path.clone(), f.address)) {
                continue;
            }
            seen.push((module.open_path.clone(), f.address));
            let name = if shorts[f.short()] > 1 {
                &f.name
            } else {
                f.short()
            };
            probes.push(ProbePoint {
                label: format!("{prefix}{name}"),
                open_path: module.open_path.clone(),
                place: Place::Function(place),
            });
        }
    }
    if probes.is_empty() {
        bail!("no function or probe given: name one, e.g. `myprobe trace ha_innobase::write_row`");
    }
    if probes.len() > MAX_PROBES {
        bail!(
            "the patterns match {} functions; at most {MAX_PROBES} are traced at once: narrow them \
             (`myprobe trace --list PATTERN` shows what they match)",
            probes.len()
        );
    }
    Ok(probes)
}

/// The files of the process that static probes may be in: the executable, then its libraries.
pub fn probe_files(target: &Target) -> Result<Vec<(String, PathBuf)>> {
    let maps = ProcMaps::read(target.pid).context("reading the process's memory map")?;
    let mut files = vec![(
        target
            .exe
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        target.binary.clone(),
    )];
    for f in maps.files_in_address_order() {
        if f.symbolic != target.exe && f.basename.contains(".so") {
            files.push((f.basename.clone(), f.open_path.clone()));
        }
    }
    Ok(files)
}

/// `PROVIDER:NAME` → one probe per file that has it.
fn usdt_probes(target: &Target, spec: &str) -> Result<Vec<ProbePoint>> {
    let Some((provider, name)) = spec.split_once(':') else {
        bail!("usdt:{spec}: a static probe is usdt:PROVIDER:NAME (`myprobe trace --list usdt` lists them)");
    };
    let mut found = Vec::new();
    let mut all = Vec::new();
    for (basename, path) in probe_files(target)? {
        let probes = usdt::probes(&path).unwrap_or_default();
        if probes
            .iter()
            .any(|p| p.provider == provider && p.name == name)
        {
            found.push(ProbePoint {
                label: format!("usdt:{provider}:{name}"),
                open_path: path.clone(),
                place: Place::Usdt {
                    provider: provider.to_string(),
                    name: name.to_string(),
                },
            });
        }
        all.extend(probes.into_iter().map(|p| (basename.clone(), p)));
    }
    if found.is_empty() {
        if all.is_empty() {
            bail!(
                "{target} has no static probes (USDT) at all, in its executable or libraries: it was built \
                 without them (Debian's MariaDB is). Trace functions instead"
            );
        }
        let mut names: Vec<String> = all
            .iter()
            .map(|(_, p)| format!("usdt:{}:{}", p.provider, p.name))
            .collect();
        names.sort();
        names.dedup();
        names.truncate(10);
        bail!(
            "no static probe usdt:{provider}:{name} in {target}; it has {}",
            names.join(", ")
        );
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_split_outside_parameter_lists() {
        assert_eq!(
            split_specs("a,b::c(int, char*),libc:malloc, x<int, int>::y"),
            ["a", "b::c(int, char*)", "libc:malloc", "x<int, int>::y"]
        );
        assert!(split_specs(" , ").is_empty());
    }
}
