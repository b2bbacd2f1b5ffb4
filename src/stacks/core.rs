//! `myprobe stacks --core`: the threads of a core file, unwound in user space with the tables the BPF unwinder
//! uses (`.eh_frame`, replayed by `unwind::replay`), and named against the binaries on this machine, checked
//! by build-id.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use object::Object as _;

use super::core_file::Core;
use crate::{
    collect::{
        threads::{Futex, ThreadRecord},
        RawStack,
    },
    process::signal_name,
    server::PROCESS_NAMES,
    symbolize::{data::DataSymbolizer, Symbolizer},
    unwind::{
        replay::{unwind, MAX_USER_FRAMES},
        ProcessTables,
    },
};

/// The threads of a core, ready to be named, and what the output says of the core.
pub struct CoreThreads {
    pub records: Vec<ThreadRecord>,
    pub symbolizer: Symbolizer,
    pub data: DataSymbolizer,
    /// `mariadbd, dumped on SIGSEGV (thread 1234)`.
    pub description: String,
    /// The signal the core was dumped on and the thread that got it.
    pub crash: Option<(String, u32)>,
    /// What the binaries on this machine lack, for stderr.
    pub warnings: Vec<String>,
}

/// Reads the core at `path`. `exe` is the binary it was dumped from, when not at the path the core names;
/// `root`, the filesystem it ran in (a container's), where the files it names are; `any_process` reads the
/// core of a program that is not a server.
pub fn read(
    path: &Path,
    exe: Option<&Path>,
    root: Option<&Path>,
    any_process: bool,
) -> Result<CoreThreads> {
    let core = Core::read(path)?;
    let core_exe = core
        .exe()
        .with_context(|| {
            format!(
                "{}: the core names no mapped files (no NT_FILE note): it cannot be unwound",
                path.display()
            )
        })?
        .to_path_buf();
    let exe_name = core_exe
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if !any_process
        && !PROCESS_NAMES.contains(&core.name.as_str())
        && !PROCESS_NAMES.contains(&exe_name.as_str())
    {
        bail!(
            "{} is a core of {}, not of a MySQL or MariaDB server (mariadbd/mysqld); pass --any-process to \
             read it anyway",
            path.display(),
            core_exe.display()
        );
    }
    let open = |p: &Path| -> PathBuf {
        match exe {
            Some(exe) if p == core_exe => exe.to_path_buf(),
            _ => super::file_under(root, p),
        }
    };
    let mut warnings = check_build_ids(&core, &core_exe, exe, root, &open)?;

    let mut tables = ProcessTables::default();
    for m in core.code_mappings(&open) {
        tables.add_mapping(&m);
    }
    warnings.append(&mut tables.warnings);
    let records = core
        .threads
        .iter()
        .map(|t| {
            let ips = unwind(&tables, t.regs, |a| core.read_u64(a), MAX_USER_FRAMES);
            let futex = (t.syscall == libc::SYS_futex).then_some(()).and_then(|()| {
                let addr = t.args[0];
                Some(Futex {
                    addr,
                    word: core.read_u32(addr)?,
                    next_int: core.read_u32(addr.wrapping_add(8))? as i32,
                })
            });
            ThreadRecord {
                tid: t.tid,
                name: core.name.clone(),
                // The scheduler's state is not in a core.
                state: None,
                on_cpu: false,
                syscall: (t.syscall >= 0).then_some((t.syscall, t.args)),
                idle_ns: None,
                futex,
                stack: RawStack {
                    user_len: ips.len() as u16,
                    ips: ips.into(),
                },
            }
        })
        .collect();
    let mut description = format!("{} ({})", core.name, core_exe.display());
    let crash = (core.signal != 0).then(|| (signal_name(core.signal.into()), core.threads[0].tid));
    if let Some((signal, tid)) = &crash {
        description += &format!(", dumped on {signal} (thread {tid})");
    }
    Ok(CoreThreads {
        records,
        symbolizer: Symbolizer::of_maps(core.proc_maps(&open)),
        data: DataSymbolizer::of_maps(core.proc_maps(&open)),
        description,
        crash,
        warnings,
    })
}

/// Checks the binaries against the build-ids the core recorded: `--exe` must be the core's executable (an
/// error otherwise); a file on this machine (`open` says where) that is another build than the one mapped is a
/// warning (its frames may be misnamed), once for each file.
fn check_build_ids(
    core: &Core,
    core_exe: &Path,
    exe: Option<&Path>,
    root: Option<&Path>,
    open: &impl Fn(&Path) -> PathBuf,
) -> Result<Vec<String>> {
    let mut warnings = Vec::new();
    if let Some(exe) = exe {
        let ours = build_id_of(exe).with_context(|| format!("--exe {}", exe.display()))?;
        match (core.build_id(core_exe), ours) {
            (Some(theirs), Some(ours)) if theirs != ours => bail!(
                "--exe {} is not the binary this core was dumped from: its build-id is {}, the core's {} had {}",
                exe.display(),
                hex(&ours),
                core_exe.display(),
                hex(&theirs)
            ),
            (None, _) => warnings.push(format!(
                "the core does not hold the build-id of {}: --exe {} is taken on trust",
                core_exe.display(),
                exe.display()
            )),
            _ => {}
        }
    }
    let mut paths: Vec<&Path> = core
        .files
        .iter()
        .filter(|f| f.offset == 0)
        .map(|f| f.path.as_path())
        .collect();
    paths.sort();
    paths.dedup();
    let (mut missing, mut other_builds) = (0, 0);
    for p in paths {
        if exe.is_some() && p == core_exe {
            continue;
        }
        let Some(theirs) = core.build_id(p) else {
            continue;
        };
        let here = open(p);
        match build_id_of(&here) {
            Err(_) => {
                missing += 1;
                warnings.push(format!(
                    "{} is not on this machine: its frames are unnamed{}",
                    here.display(),
                    if p == core_exe {
                        " (give the binary with --exe)"
                    } else {
                        ""
                    }
                ))
            }
            Ok(Some(ours)) if ours != theirs => {
                other_builds += 1;
                warnings.push(format!(
                    "{} on this machine is another build than the core's (build-id {}, the core's {}): its \
                     frames may be misnamed{}",
                    here.display(),
                    hex(&ours),
                    hex(&theirs),
                    if p == core_exe {
                        "; give the right binary with --exe"
                    } else {
                        ""
                    }
                ))
            }
            Ok(_) => {}
        }
    }
    // Most files missing or other builds: the server ran in a filesystem of its own.
    if root.is_none() && missing + other_builds > 2 {
        warnings.push(format!(
            "{missing} of the core's files are not on this machine and {other_builds} are other builds: if the \
             server ran in a container, give its filesystem with --root DIR (its image's, or /proc/PID/root of a \
             container of the same image)"
        ));
    }
    Ok(warnings)
}

/// The build-id of the ELF file at `path` (`None` if it has none).
pub(super) fn build_id_of(path: &Path) -> Result<Option<Vec<u8>>> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let cache = object::ReadCache::new(file);
    let obj = object::File::parse(&cache)
        .with_context(|| format!("{} is not an ELF file", path.display()))?;
    Ok(obj.build_id().ok().flatten().map(<[u8]>::to_vec))
}

pub(super) fn hex(id: &[u8]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}
