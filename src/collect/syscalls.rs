//! Syscalls by user stack (src/bpf/syscalls.bpf.c): every syscall of the process timed from entry to exit,
//! summed per (syscall, stack) in the kernel, with the errors by errno.

use anyhow::{Context, Result};
use syscalls::Sysno;

use super::{
    maps::{for_each_per_cpu, for_each_typed, Plain},
    skeleton::stack_skeleton,
    stack_collector::{self, Collector, Loaded, Open, Stacks, Sum},
    CollectOptions, Collected, Features,
};

mod skel {
    include!(concat!(env!("OUT_DIR"), "/syscalls.skel.rs"));
}
stack_skeleton!(
    Skeleton,
    SyscallsSkelBuilder,
    OpenSyscallsSkel,
    SyscallsSkel
);
// SAFETY: generated from BTF structs of integers.
unsafe impl Plain for skel::types::syscall_key {}
// SAFETY: as above.
unsafe impl Plain for skel::types::syscall_calls {}
// SAFETY: as above.
unsafe impl Plain for skel::types::errno_key {}

/// What tracing found: rows keyed by syscall number, with `calls`, `total_ns`, `max_ns` and `errors` per
/// (syscall, stack); and the failed calls by (syscall, errno).
pub struct Found {
    pub collected: Collected,
    pub errors: Vec<Failed>,
}

/// Calls of one syscall that failed with one errno.
#[derive(Clone, Copy, Debug)]
pub struct Failed {
    pub nr: u32,
    pub errno: u32,
    pub calls: u64,
}

/// Traces the syscalls `only` (all when empty) that take at least `min_ns`.
pub fn collect(opts: &CollectOptions, min_ns: u64, only: &[Sysno]) -> Result<Found> {
    let mut syscalls = Syscalls {
        min_ns,
        only: only.to_vec(),
        errors: Vec::new(),
    };
    let collected = stack_collector::run(&mut syscalls, opts)?;
    Ok(Found {
        collected,
        errors: syscalls.errors,
    })
}

struct Syscalls {
    min_ns: u64,
    only: Vec<Sysno>,
    errors: Vec<Failed>,
}

impl Collector for Syscalls {
    type Skel = Skeleton;
    const NAME: &'static str = "profile syscalls";
    const KIND: super::Kind = super::Kind::Syscalls;

    fn columns(&self) -> Vec<String> {
        ["calls", "total_ns", "max_ns", "errors"]
            .map(String::from)
            .to_vec()
    }

    fn configure(&mut self, open: &mut Open<'_, Self>, _: &Features) -> Result<()> {
        let rodata = super::rodata(open.maps.rodata_data.as_deref_mut())?;
        rodata.min_ns = self.min_ns;
        let traced = &mut rodata.traced_syscall;
        if self.only.is_empty() {
            traced.fill(true);
        }
        for nr in &self.only {
            let slot = traced.get_mut(nr.id() as usize);
            *slot
                .with_context(|| format!("syscall {nr} ({}) is beyond those traced", nr.id()))? =
                true;
        }
        Ok(())
    }

    fn read(&mut self, skel: &mut Loaded<'_, Self>, _: &mut Stacks) -> Result<Vec<Sum>> {
        let mut sums = Vec::new();
        for_each_per_cpu(
            &skel.maps.calls,
            |k: skel::types::syscall_key, per_cpu: Vec<skel::types::syscall_calls>| {
                sums.push(Sum {
                    pid: 0,
                    tid: 0,
                    key: k.nr.into(),
                    stack_id: k.stack_id,
                    values: Box::new(sum_cpus(&per_cpu)),
                    statement: 0,
                });
            },
        );
        for_each_typed(
            &skel.maps.errors,
            |k: skel::types::errno_key, calls: u64| {
                self.errors.push(Failed {
                    nr: k.nr,
                    errno: k.err,
                    calls,
                });
            },
        );
        Ok(sums)
    }
}

/// One (syscall, stack)'s counts over the CPUs: calls, total, longest, errors; sums stop at `u64::MAX`.
fn sum_cpus(per_cpu: &[skel::types::syscall_calls]) -> [u64; 4] {
    let mut values = [0u64; 4];
    for c in per_cpu {
        values[0] = values[0].saturating_add(c.count);
        values[1] = values[1].saturating_add(c.total_ns);
        values[2] = values[2].max(c.max_ns);
        values[3] = values[3].saturating_add(c.errors);
    }
    values
}

/// The name of syscall `nr` on this architecture.
pub fn name(nr: u64) -> String {
    match usize::try_from(nr).ok().and_then(Sysno::new) {
        Some(s) => s.name().to_string(),
        None => format!("syscall_{nr}"),
    }
}

/// The name of errno `n` (ENOENT), or its number.
pub fn errno_name(n: u32) -> String {
    let errno = syscalls::Errno::new(n as i32);
    errno
        .name()
        .map_or_else(|| format!("errno {n}"), str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_cpu_sums_past_the_largest_stop_there() {
        let cpu = |count, total_ns, max_ns, errors| skel::types::syscall_calls {
            count,
            total_ns,
            max_ns,
            errors,
        };
        let per_cpu = [cpu(u64::MAX, u64::MAX - 1, 9, 1), cpu(2, 2, 4, u64::MAX)];
        assert_eq!(sum_cpus(&per_cpu), [u64::MAX, u64::MAX, 9, u64::MAX]);
        assert_eq!(sum_cpus(&[cpu(1, 2, 3, 4), cpu(1, 2, 5, 4)]), [2, 4, 5, 8]);
    }
}
