//! On-CPU sampling (src/bpf/cpu.bpf.c): a software CPU-clock perf event per CPU at `freq_hz`; every sample
//! sends its stack, and the samples are counted per (thread, stack) here.

use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};

use anyhow::{Context, Result};
use libbpf_rs::Link;
use perf_event_open_sys as perf;

use super::{
    online_cpus,
    skeleton::stack_skeleton,
    stack_collector::{self, Collector, Loaded, Open, Stacks, Sum},
    CollectOptions, Collected,
};

mod skel {
    include!(concat!(env!("OUT_DIR"), "/cpu.skel.rs"));
}
stack_skeleton!(Skeleton, CpuSkelBuilder, OpenCpuSkel, CpuSkel);
const _: () = assert!(
    std::mem::offset_of!(skel::types::statement_text, text) == super::labels::TEXT_HEADER_BYTES
);

/// Rows: `samples` per (thread, stack).
pub fn collect(opts: &CollectOptions, freq_hz: u64) -> Result<Collected> {
    stack_collector::run(&mut Cpu { freq_hz }, opts)
}

struct Cpu {
    freq_hz: u64,
}

impl Collector for Cpu {
    type Skel = Skeleton;
    const NAME: &'static str = "profile cpu";
    const KIND: super::Kind = super::Kind::Cpu;

    fn columns(&self) -> Vec<String> {
        vec!["samples".into()]
    }

    fn label_statements(&mut self, open: &mut Open<'_, Self>) -> Result<bool> {
        super::rodata(open.maps.rodata_data.as_deref_mut())?.statement_labels = true;
        Ok(true)
    }

    fn attach(&mut self, skel: &mut Loaded<'_, Self>) -> Result<Vec<Link>> {
        let mut links = Vec::new();
        for cpu in online_cpus()? {
            let fd = open_cpu_clock(cpu, self.freq_hz)?;
            let link = skel
                .progs
                .on_cpu_sample
                .attach_perf_event(fd.as_raw_fd())
                .with_context(|| format!("attaching the sampler to CPU {cpu}"))?;
            // The link owns the event now: libbpf closes it when the link is destroyed
            // (bpf_link_perf_detach). Kept here as well, it was closed twice, the second time under whoever
            // had been given its number meanwhile. A failed attach leaves it ours, closed on return.
            let _ = fd.into_raw_fd();
            links.push(link);
        }
        Ok(links)
    }

    fn read(&mut self, _: &mut Loaded<'_, Self>, stacks: &mut Stacks) -> Result<Vec<Sum>> {
        Ok(stacks.take_records())
    }

    fn slice(&mut self, _: &mut Loaded<'_, Self>, stacks: &mut Stacks) -> Result<Vec<Sum>> {
        Ok(stacks.take_records())
    }
}

fn open_cpu_clock(cpu: u32, freq_hz: u64) -> Result<OwnedFd> {
    let mut attr = perf::bindings::perf_event_attr {
        type_: perf::bindings::PERF_TYPE_SOFTWARE,
        size: std::mem::size_of::<perf::bindings::perf_event_attr>() as u32,
        config: perf::bindings::PERF_COUNT_SW_CPU_CLOCK as u64,
        ..Default::default()
    };
    attr.__bindgen_anon_1.sample_freq = freq_hz;
    attr.set_freq(1);
    // SAFETY: attr is a valid, fully initialized perf_event_attr.
    let fd = unsafe {
        perf::perf_event_open(
            &mut attr,
            -1,
            cpu as i32,
            -1,
            perf::bindings::PERF_FLAG_FD_CLOEXEC as _,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("opening a CPU-clock perf event on CPU {cpu}"));
    }
    // SAFETY: fd was just returned by perf_event_open and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
