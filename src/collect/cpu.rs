//! On-CPU sampling (src/bpf/cpu.bpf.c): a software CPU-clock perf event per CPU at `freq_hz`.

use std::{mem::MaybeUninit, os::fd::{FromRawFd, OwnedFd, AsRawFd}};

use anyhow::{Context, Result};
use libbpf_rs::skel::OpenSkel;
use perf_event_open_sys as perf;

use super::{drain, install_unwind, Installed, online_cpus, open_skel, size_unwind_maps, CollectOptions, Collected};

mod skel {
    include!(concat!(env!("OUT_DIR"), "/cpu.skel.rs"));
}
use skel::*;

pub fn collect(opts: &CollectOptions, freq_hz: u64) -> Result<Collected> {
    let mut object = MaybeUninit::uninit();
    let mut open = open_skel(CpuSkelBuilder::default(), &mut object, opts)?;
    let rodata = open.maps.rodata_data.as_deref_mut().context("BPF object has no .rodata")?;
    rodata.target_tgid = opts.pid;
    rodata.kernel_stacks = opts.kernel_stacks;
    size_unwind_maps(&mut open.maps.unwind_rows, &mut open.maps.unwind_pages, opts)?;
    let mut skel = open.load().context("loading the CPU sampling program into the kernel")?;
    let bss = skel.maps.bss_data.as_deref_mut().context("BPF object has no .bss")?;
    let mut installed = Installed::default();
    let (rows, pages) = (&skel.maps.unwind_rows, &skel.maps.unwind_pages);
    install_unwind(opts, &mut installed, &mut unwind_maps!(rows, pages, bss))?;

    let mut perf_fds = Vec::new();
    let mut links = Vec::new();
    for cpu in online_cpus()? {
        let fd = open_cpu_clock(cpu, freq_hz)?;
        links.push(
            skel.progs
                .on_cpu_sample
                .attach_perf_event(fd.as_raw_fd())
                .with_context(|| format!("attaching the sampler to CPU {cpu}"))?,
        );
        perf_fds.push(fd);
    }

    let result = drain(&skel.maps.events, opts, "profile cpu", (&mut installed, unwind_maps!(rows, pages, bss)), |_, _| {
        Ok(bss.lost)
    });
    drop(links);
    drop(perf_fds);
    result
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
    let fd = unsafe { perf::perf_event_open(&mut attr, -1, cpu as i32, -1, perf::bindings::PERF_FLAG_FD_CLOEXEC as _) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("opening a CPU-clock perf event on CPU {cpu}"));
    }
    // SAFETY: fd was just returned by perf_event_open and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
