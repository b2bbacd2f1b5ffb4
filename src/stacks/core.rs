//! `myprobe stacks --core`: the threads of a core file, unwound in user space with the tables the BPF unwinder
//! uses (`.eh_frame`, replayed by `unwind::replay`), and named against the binaries on this machine, checked
//! by build-id.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use object::Object as _;

use super::core_file::Core;
use crate::process::memory::Memory;
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
    /// The server's connections as the core holds them (`None`: not a server's core, or they could not be read:
    /// said in `warnings`).
    pub sessions: Option<Vec<crate::sessions::Session>>,
    /// When the core was written (its file's time), in microseconds since the epoch: the time its statements'
    /// durations end at.
    pub dumped_us: Option<u64>,
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
    let is_server =
        PROCESS_NAMES.contains(&core.name.as_str()) || PROCESS_NAMES.contains(&exe_name.as_str());
    if !any_process && !is_server {
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
    warnings.append(&mut tables.process.warnings);
    let records = core
        .threads
        .iter()
        .map(|t| {
            let ips = unwind(
                tables.tables(),
                t.regs,
                |a| core.read_u64(a),
                MAX_USER_FRAMES,
            );
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
                name: core.name.as_str().into(),
                // The scheduler's state is not in a core.
                state: None,
                on_cpu: false,
                syscall: (t.syscall >= 0).then_some((t.syscall, t.args)),
                idle_ns: None,
                futex,
                tls_base: t.tls_base,
                switches: 0,
                known_wait: false,
                user_sp: 0,
                stack: RawStack {
                    user_len: ips.len() as u16,
                    ips: ips.into(),
                },
            }
        })
        .collect();
    let sessions = match is_server.then(|| sessions_of(&core, &core_exe, &exe_name, &open)) {
        Some(Ok(sessions)) => Some(sessions),
        Some(Err(e)) => {
            warnings.push(format!(
                "the connections could not be read from the core: {e:#}"
            ));
            None
        }
        None => None,
    };
    let dumped_us = std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_micros() as u64);
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
        sessions,
        dumped_us,
    })
}

/// The connections of the server whose core is `core`, dumped from `exe` (named `exe_name`; `open` says where
/// the file is here): its version, from the core's memory, says which server's layout to read them with.
fn sessions_of(
    core: &Core,
    exe: &Path,
    exe_name: &str,
    open: &impl Fn(&Path) -> PathBuf,
) -> Result<Vec<crate::sessions::Session>> {
    let binary = open(exe);
    let file =
        std::fs::File::open(&binary).with_context(|| format!("opening {}", binary.display()))?;
    let mapped = core
        .mapped_start(exe)
        .with_context(|| format!("the core does not map {} from its start", exe.display()))?;
    let version = crate::process::server_version_at(core, &file, mapped).unwrap_or_default();
    let server = crate::server::Flavor::of(&version, Some(exe_name), |_| false).server();
    let layout = crate::sessions::Layout::at(&file, &binary, mapped, server)?;
    if let Some(unknown) = layout.unknown() {
        say!("myprobe: {unknown}");
    }
    crate::sessions::read(&WithFiles::new(core, open), &layout)
}

/// A core's memory, and where it kept none, the files it maps as they are on this machine: a core leaves out
/// what the process never wrote of its files (the server's constant strings, such as the host `localhost`), as
/// gdb reads those from the files too.
struct WithFiles<'a> {
    core: &'a Core,
    /// Each file mapping: its start, end, offset in the file, and its file among `opened` (`None`: not here).
    files: Vec<(u64, u64, u64, Option<usize>)>,
    /// Each file opened once, however many mappings it has.
    opened: Vec<std::fs::File>,
}

impl<'a> WithFiles<'a> {
    fn new(core: &'a Core, open: &impl Fn(&Path) -> PathBuf) -> WithFiles<'a> {
        let mut by_path: std::collections::HashMap<&Path, Option<usize>> =
            std::collections::HashMap::new();
        let mut opened = Vec::new();
        let files = core
            .files
            .iter()
            .map(|f| {
                let file = *by_path.entry(&f.path).or_insert_with(|| {
                    let file = std::fs::File::open(open(&f.path)).ok()?;
                    opened.push(file);
                    Some(opened.len() - 1)
                });
                (f.start, f.end, f.offset, file)
            })
            .collect();
        WithFiles {
            core,
            files,
            opened,
        }
    }
}

impl Memory for WithFiles<'_> {
    fn read(&self, addr: u64, buf: &mut [u8]) -> usize {
        use std::os::unix::fs::FileExt;
        let n = self.core.read(addr, buf);
        if n > 0 {
            return n;
        }
        let Some(&(start, end, offset, Some(file))) = self
            .files
            .iter()
            .find(|(start, end, _, file)| (*start..*end).contains(&addr) && file.is_some())
        else {
            return 0;
        };
        let len = buf.len().min((end - addr) as usize);
        let at = offset.saturating_add(addr - start);
        self.opened[file].read_at(&mut buf[..len], at).unwrap_or(0)
    }
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
