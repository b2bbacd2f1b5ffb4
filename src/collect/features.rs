//! What the running kernel offers, probed rather than inferred from its version: distribution kernels
//! backport features, so a version number says little. As libbpf and bpftool probe, a tiny program is loaded
//! and linked (uprobe_multi links, uprobe sessions), or the kernel itself is asked (a helper known to its
//! verifier, a type in its BTF).
//!
//! `MYPROBE_DISABLE=uprobe_multi,uprobe_session,...` turns probed features off, so that tests can run the
//! ways of older kernels on this one.

use std::{os::fd::FromRawFd, os::fd::OwnedFd, path::Path, sync::OnceLock};

use anyhow::{bail, Result};
use libbpf_rs::{libbpf_sys as sys, Btf, ProgramType};

// COMPAT_OBJECTS: the objects build.rs also built for kernels without bpf_loop.
include!(concat!(env!("OUT_DIR"), "/compat_objects.rs"));

/// The kernel features the collectors choose between.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Features {
    /// `bpf_loop` (5.17): the unwinder's loops; without it, the collectors that can run their compat build
    /// (compat.h: frame pointers, hash maps by thread id for task storage), the others refuse.
    pub bpf_loop: bool,
    /// The BPF ring buffer (5.8). Required.
    pub ringbuf: bool,
    /// One uprobe_multi link for many uprobes (6.6): detached with one wait instead of one per probe.
    pub uprobe_multi: bool,
    /// uprobe sessions (6.13): a return probe armed only for the calls its entry chooses.
    pub uprobe_session: bool,
    /// Sleepable task iterators that read another task's memory (`bpf_copy_from_user_task`, 5.18): the
    /// stacks of threads that never ran while traced.
    pub task_stacks: bool,
    /// The scheduler's own count of each task's waits for a CPU (`struct sched_info`: CONFIG_SCHED_INFO, and
    /// /proc/PID/schedstat), and a task's run queue (its clock) from its scheduling entity
    /// (CONFIG_FAIR_GROUP_SCHED): `queries` reads a woken thread's wait at its switch in, with no program at
    /// every wakeup of the host.
    pub sched_info: bool,
    /// futex's own syscall tracepoints (CONFIG_FTRACE_SYSCALLS, in tracefs, where libbpf attaches them): a
    /// program there runs for futex calls only, where one on the raw `sys_enter` runs for every syscall.
    pub futex_tracepoints: bool,
    /// The socket layer's tracepoints at the end of each recv and send (`sock_recv_length`,
    /// `sock_send_length`, 6.3), on x86-64 (whose saved registers tell a syscall in progress): `queries`
    /// follows the protocol there, with no program at every syscall of the host.
    pub socket_tracepoints: bool,
}

impl Features {
    /// The features of the running kernel (probed once per process); `btf`: the kernel's BTF when it has none
    /// of its own (`--btf`).
    pub fn of_kernel(btf: Option<&Path>) -> Features {
        // Asked at every poll (stack_collector's unwind refresh): the environment is read once, with the probe.
        static PROBED: OnceLock<Features> = OnceLock::new();
        *PROBED.get_or_init(|| {
            Features::probe(btf).without(&std::env::var("MYPROBE_DISABLE").unwrap_or_default())
        })
    }

    /// Whether the collectors run their compat build (compat.h): kernels before 5.17, without `bpf_loop`.
    pub fn compat(&self) -> bool {
        !self.bpf_loop
    }

    /// The error to give when the kernel lacks what every collector needs, even in its compat build.
    pub fn require_basics(&self) -> Result<()> {
        if !self.ringbuf {
            bail!(
                "this kernel ({}) has no BPF ring buffer (Linux 5.8 and later have it): myprobe's programs \
                 need it",
                kernel_release()
            );
        }
        Ok(())
    }

    /// The error to give when the kernel needs the compat build and `collector` (its object's name) has none.
    pub fn require_build_for(&self, collector: &str) -> Result<()> {
        if self.compat() && !COMPAT_OBJECTS.contains(&collector) {
            bail!(
                "this kernel ({}) has no bpf_loop helper (Linux 5.17 and later have it): myprobe's `{collector}` \
                 programs need it",
                kernel_release()
            );
        }
        Ok(())
    }

    /// What the compat build loses, said once on stderr.
    pub fn compat_note(&self) -> Option<String> {
        self.compat().then(|| {
            format!(
                "myprobe: note: this kernel ({}) has no bpf_loop helper (Linux 5.17 and later have it): user \
                 stacks follow frame pointers, and the unwind rows myprobe looks up by address where they fail \
                 (functions built without them: Debian's glibc); a stack taken before its rows were in may stop \
                 short",
                kernel_release()
            )
        })
    }

    fn probe(btf: Option<&Path>) -> Features {
        let kernel_btf = match btf {
            Some(path) => Btf::from_path(path).ok(),
            None => Btf::from_vmlinux().ok(),
        };
        let has_enum_value = |value: &str| {
            kernel_btf.as_ref().is_some_and(|btf| {
                btf.type_by_kind::<libbpf_rs::btf::types::Enum<'_>>()
                    .any(|e| {
                        e.iter()
                            .any(|m| m.name.is_some_and(|n| n.to_str() == Some(value)))
                    })
            })
        };
        let has_struct = |name: &str| {
            kernel_btf.as_ref().is_some_and(|btf| {
                btf.type_by_name::<libbpf_rs::btf::types::Struct<'_>>(name)
                    .is_some()
            })
        };
        let has_member = |name: &str, member: &str| {
            kernel_btf.as_ref().is_some_and(|btf| {
                btf.type_by_name::<libbpf_rs::btf::types::Struct<'_>>(name)
                    .is_some_and(|s| {
                        s.iter()
                            .any(|m| m.name.and_then(|n| n.to_str()) == Some(member))
                    })
            })
        };
        let has_typedef = |name: &str| {
            kernel_btf.as_ref().is_some_and(|btf| {
                btf.type_by_name::<libbpf_rs::btf::types::Typedef<'_>>(name)
                    .is_some()
            })
        };
        Features {
            bpf_loop: ProgramType::Kprobe
                .is_helper_supported(sys::BPF_FUNC_loop)
                .unwrap_or(false),
            ringbuf: ProgramType::Kprobe
                .is_helper_supported(sys::BPF_FUNC_ringbuf_output)
                .unwrap_or(false),
            uprobe_multi: links_uprobes(sys::BPF_TRACE_UPROBE_MULTI),
            uprobe_session: links_uprobes(sys::BPF_TRACE_UPROBE_SESSION),
            // The helper is only offered to sleepable programs, which the helper probe cannot load: the
            // kernel's list of helpers says whether it has it.
            task_stacks: has_struct("bpf_iter__task")
                && has_enum_value("BPF_FUNC_copy_from_user_task"),
            // Without CONFIG_SCHED_INFO the struct is empty and /proc/PID/schedstat absent.
            sched_info: has_member("sched_info", "last_queued")
                && has_member("sched_info", "run_delay")
                && has_member("sched_entity", "cfs_rq")
                && has_member("cfs_rq", "rq")
                && has_member("rq", "clock")
                && Path::new("/proc/self/schedstat").exists(),
            futex_tracepoints: has_syscall_tracepoint("sys_enter_futex")
                && has_syscall_tracepoint("sys_exit_futex"),
            socket_tracepoints: cfg!(target_arch = "x86_64")
                && has_typedef("btf_trace_sock_recv_length")
                && has_typedef("btf_trace_sock_send_length"),
        }
    }

    /// Each feature with its name, as `MYPROBE_DISABLE` and `myprobe features` name it.
    fn by_name(&mut self) -> [(&'static str, &mut bool); 8] {
        [
            ("bpf_loop", &mut self.bpf_loop),
            ("ringbuf", &mut self.ringbuf),
            ("uprobe_multi", &mut self.uprobe_multi),
            ("uprobe_session", &mut self.uprobe_session),
            ("task_stacks", &mut self.task_stacks),
            ("sched_info", &mut self.sched_info),
            ("futex_tracepoints", &mut self.futex_tracepoints),
            ("socket_tracepoints", &mut self.socket_tracepoints),
        ]
    }

    /// `name=yes|no` for each feature (`myprobe features`, for scripts/kernels).
    pub fn summary(mut self) -> String {
        self.by_name()
            .map(|(name, has)| format!("{name}={}", if *has { "yes" } else { "no" }))
            .join(" ")
    }

    /// These features, less those named in `disabled` (comma-separated).
    fn without(mut self, disabled: &str) -> Features {
        let known = self.by_name().map(|(n, _)| n);
        for name in disabled.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            match self.by_name().into_iter().find(|(n, _)| *n == name) {
                Some((_, has)) => *has = false,
                None => say!(
                    "myprobe: warning: MYPROBE_DISABLE names no feature `{name}` (known: {})",
                    known.join(", ")
                ),
            }
        }
        self
    }
}

/// Whether tracefs has the syscall tracepoint `name` (`sys_enter_futex`), where libbpf looks for it: under
/// debugfs when that is mounted, else tracefs's own mount point.
pub fn has_syscall_tracepoint(name: &str) -> bool {
    let debugfs = Path::new("/sys/kernel/debug/tracing");
    let tracefs = if debugfs.exists() {
        debugfs
    } else {
        Path::new("/sys/kernel/tracing")
    };
    tracefs
        .join("events/syscalls")
        .join(name)
        .join("id")
        .exists()
}

/// Whether the kernel links uprobes of `attach_type` (uprobe_multi, uprobe session), as libbpf probes it: a
/// program that only returns is loaded for that attach type, and linked to `/`, which a kernel that knows
/// the link refuses as a bad file (EBADF) and one that does not as an invalid argument.
fn links_uprobes(attach_type: sys::bpf_attach_type) -> bool {
    // r0 = 0; exit
    let insns = [
        sys::bpf_insn {
            code: (sys::BPF_ALU64 | sys::BPF_MOV | sys::BPF_K) as u8,
            ..Default::default()
        },
        sys::bpf_insn {
            code: (sys::BPF_JMP | sys::BPF_EXIT) as u8,
            ..Default::default()
        },
    ];
    let mut load_opts = sys::bpf_prog_load_opts {
        sz: std::mem::size_of::<sys::bpf_prog_load_opts>() as _,
        expected_attach_type: attach_type,
        ..Default::default()
    };
    // SAFETY: the instructions and options are valid for the call; the license is a NUL-terminated string.
    let prog = unsafe {
        sys::bpf_prog_load(
            sys::BPF_PROG_TYPE_KPROBE,
            std::ptr::null(),
            c"GPL".as_ptr(),
            insns.as_ptr(),
            insns.len() as _,
            &mut load_opts,
        )
    };
    if prog < 0 {
        return false;
    }
    // SAFETY: prog is a new file descriptor owned by nobody else.
    let prog = unsafe { OwnedFd::from_raw_fd(prog) };
    let offset: std::os::raw::c_ulong = 0;
    let mut link_opts = sys::bpf_link_create_opts {
        sz: std::mem::size_of::<sys::bpf_link_create_opts>() as _,
        ..Default::default()
    };
    link_opts.__bindgen_anon_1.uprobe_multi.path = c"/".as_ptr();
    link_opts.__bindgen_anon_1.uprobe_multi.offsets = &offset;
    link_opts.__bindgen_anon_1.uprobe_multi.cnt = 1;
    // SAFETY: the options point to live values for the duration of the call.
    let link = unsafe {
        sys::bpf_link_create(
            std::os::fd::AsRawFd::as_raw_fd(&prog),
            -1,
            attach_type,
            &link_opts,
        )
    };
    let err = std::io::Error::last_os_error().raw_os_error();
    if link >= 0 {
        // SAFETY: a new file descriptor owned by nobody else; closed on drop.
        drop(unsafe { OwnedFd::from_raw_fd(link) });
        return true;
    }
    err == Some(libc::EBADF)
}

/// The running kernel's release (`uname -r`), for errors that name it.
fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// The object a skeleton opens: `compat`, built for kernels without `bpf_loop` (compat.h), where the kernel has
/// none; else `modern`. Every BPF command has checked the kernel before (`features::check_environment`).
pub fn object_for_kernel(modern: &'static [u8], compat: &'static [u8]) -> &'static [u8] {
    if Features::of_kernel(None).compat() {
        compat
    } else {
        modern
    }
}

/// Checks what tracing needs before anything is loaded: root, BTF for CO-RE, and the helpers every BPF object of
/// myprobe calls ([`Features::require_basics`]).
pub fn check_environment(btf: Option<&Path>) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("myprobe needs root to load BPF programs and open perf events: run it with sudo");
    }
    match btf {
        Some(path) if !path.is_file() => {
            bail!(
                "BTF file {} does not exist: pass the BTF of the running kernel with --btf",
                path.display()
            )
        }
        Some(_) => {}
        None if !Path::new("/sys/kernel/btf/vmlinux").exists() => bail!(
            "this kernel has no BTF (/sys/kernel/btf/vmlinux is missing): use a kernel built with \
             CONFIG_DEBUG_INFO_BTF=y, or pass a BTF file for it with --btf"
        ),
        None => {}
    }
    let features = Features::of_kernel(btf);
    features.require_basics()?;
    if let Some(note) = features.compat_note() {
        say!("{note}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disabling_turns_features_off() {
        let all = Features {
            bpf_loop: true,
            ringbuf: true,
            uprobe_multi: true,
            uprobe_session: true,
            task_stacks: true,
            sched_info: true,
            futex_tracepoints: true,
            socket_tracepoints: true,
        };
        let older = all.without("uprobe_multi, uprobe_session");
        assert!(
            !older.uprobe_multi && !older.uprobe_session && older.bpf_loop && older.task_stacks
        );
        assert_eq!(all.without(""), all);
    }

    #[test]
    fn this_kernel_has_what_the_tests_rely_on() {
        // Needs root to load programs; the tests run as root (make test).
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let f = Features::probe(None);
        assert!(
            f.bpf_loop
                && f.uprobe_multi
                && f.uprobe_session
                && f.task_stacks
                && f.sched_info
                && f.futex_tracepoints
                && f.socket_tracepoints,
            "{f:?}"
        );
    }
}
