//! The unwind tables in the kernel, shared: one pair of arrays (`unwind_rows`, `unwind_pages` of
//! src/bpf/unwind.h) made by user space, which every collector loaded for the processes of a store reuses in
//! place of its own. A server's four collectors hold one copy of its tables instead of four, and the agent's
//! servers whose code is the same files (or files with the same tables: one image in two containers) share one
//! ([`Stores`]). The process's memory map is read again for new code once a second for all of them, and each
//! collector publishes the mappings to its own programs (`.bss`) when they change.

use std::{
    collections::HashMap,
    os::fd::AsFd,
    sync::{Arc, Mutex, MutexGuard, Weak},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use libbpf_rs::{libbpf_sys, MapCore, MapFlags, MapHandle, MapType, OpenMapMut};

use super::maps::{as_bytes, Plain};
use crate::unwind::{Arena, BpfMapping, BpfRow, Compiled, Mappings, Tables};

/// Rows (and page index entries) the arrays hold beyond the tables they were made for: libraries loaded
/// while tracing, and the servers that join the store later with code of their own.
const SPARE_UNWIND_ROWS: usize = 65536;

/// The maps of every collector's object that are the store's (`budget::fit` leaves them out: they are counted
/// once, when made).
pub const SHARED_MAPS: [&str; 2] = ["unwind_rows", "unwind_pages"];

/// How often a process's memory map is read again for code mapped while tracing.
const UNWIND_REFRESH_INTERVAL: Duration = Duration::from_secs(1);

/// The unwind tables of one process or more, and their arrays in the kernel once a collector is loaded.
pub struct UnwindStore {
    inner: Mutex<Inner>,
}

struct Inner {
    arena: Arena,
    processes: HashMap<u32, Process>,
    kernel: Option<Kernel>,
}

struct Process {
    mappings: Mappings,
    /// Counts the changes of `mappings`: a collector publishes them again when it last published another.
    generation: u32,
    refreshed: Instant,
    warned: bool,
}

/// The arrays, owned here (each collector's object holds a duplicate of the descriptors), and how much of
/// the arena is written into them.
struct Kernel {
    rows: MapHandle,
    pages: MapHandle,
    rows_written: usize,
    pages_written: usize,
}

/// What a collector has published of a store to its programs.
#[derive(Default)]
pub(crate) struct Installed {
    generation: Option<u32>,
}

impl UnwindStore {
    /// The tables of `pid` for a collector's `CollectOptions::unwind`: none when stacks are walked by frame
    /// pointers (asked for, or not x86_64); what the tables lack is said on stderr.
    pub fn for_tracing(pid: u32, frame_pointers: bool) -> Result<Option<Arc<Self>>> {
        if frame_pointers || !cfg!(target_arch = "x86_64") {
            return Ok(None);
        }
        let (store, warnings) =
            Self::of(pid).context("reading the unwind tables of the process")?;
        for w in &warnings {
            say!("myprobe: warning: {w}");
        }
        Ok(Some(store))
    }

    /// The tables of `pid`, and what they lack.
    pub fn of(pid: u32) -> Result<(Arc<Self>, Vec<String>)> {
        Ok(Self::of_compiled(pid, Compiled::read(pid)?))
    }

    fn of_compiled(pid: u32, compiled: Compiled) -> (Arc<Self>, Vec<String>) {
        let mut arena = Arena::default();
        let mappings = compiled.place(&mut arena);
        let warnings = mappings.warnings.clone();
        let store = UnwindStore {
            inner: Mutex::new(Inner {
                arena,
                processes: HashMap::from([(pid, Process::new(mappings))]),
                kernel: None,
            }),
        };
        (Arc::new(store), warnings)
    }

    /// Adds the tables of `pid` (compiled outside the lock, which the store's collectors take as they trace)
    /// if the arrays, once made, hold them with half their spare room left; else gives them back.
    fn join(&self, pid: u32, compiled: Compiled) -> Option<Compiled> {
        let mut inner = self.lock();
        if let Some(k) = &inner.kernel {
            let (rows, pages) = compiled.missing_from(&inner.arena);
            let room = |written: usize, more: usize, map: &MapHandle| {
                written + more + SPARE_UNWIND_ROWS / 2 <= map.max_entries() as usize
            };
            if !room(inner.arena.rows.len(), rows, &k.rows)
                || !room(inner.arena.pages.len(), pages, &k.pages)
            {
                return Some(compiled);
            }
        }
        let mappings = compiled.place(&mut inner.arena);
        for w in &mappings.warnings {
            say!("myprobe: warning: {w}");
        }
        inner.processes.insert(pid, Process::new(mappings));
        None
    }

    /// Forgets `pid`, which exited; its files' rows stay for the others.
    pub fn leave(&self, pid: u32) {
        self.lock().processes.remove(&pid);
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes a collector's (not yet loaded) unwind maps the store's, making them first: room for the tables
    /// as they are and [`SPARE_UNWIND_ROWS`] more, within `budget` bytes of kernel memory.
    pub(crate) fn share(
        &self,
        rows: &mut OpenMapMut<'_>,
        pages: &mut OpenMapMut<'_>,
        budget: u64,
    ) -> Result<()> {
        let mut inner = self.lock();
        if inner.kernel.is_none() {
            let sizes = (
                inner.arena.rows.len() + SPARE_UNWIND_ROWS,
                inner.arena.pages.len() + SPARE_UNWIND_ROWS,
            );
            // Array values are 8-byte aligned.
            let bytes = (sizes.0 * 16 + sizes.1 * 8) as u64;
            anyhow::ensure!(
                bytes <= budget,
                "the unwind tables (unwind_rows, unwind_pages) need {:.1} MiB of kernel memory, more than \
                 --max-kernel-mem {} MiB allows: \
                 raise it, or walk stacks by frame pointers (--frame-pointers) without unwind tables",
                bytes as f64 / f64::from(1 << 20),
                budget >> 20
            );
            inner.kernel = Some(Kernel::new(sizes.0, sizes.1)?);
        }
        let k = inner.kernel.as_ref().expect("made above");
        rows.reuse_fd(k.rows.as_fd())
            .context("sharing the unwind table map")?;
        pages
            .reuse_fd(k.pages.as_fd())
            .context("sharing the unwind page map")
    }

    /// Reads the memory map of `pid` again for new code, at most once per [`UNWIND_REFRESH_INTERVAL`] for
    /// all the collectors that ask.
    pub(crate) fn refresh(&self, pid: u32) {
        let mut inner = self.lock();
        let Inner {
            arena, processes, ..
        } = &mut *inner;
        let Some(p) = processes.get_mut(&pid) else {
            return;
        };
        if p.refreshed.elapsed() < UNWIND_REFRESH_INTERVAL {
            return;
        }
        p.refreshed = Instant::now();
        if p.mappings.update(arena).unwrap_or(false) {
            p.generation = p.generation.wrapping_add(1);
        }
    }

    /// Writes the rows not yet in the kernel, then, if the mappings of `pid` changed since this collector
    /// last published them, gives `publish` the first `capacity` of them (those whose rows did not fit
    /// without any: frame pointers there). Rows are written before the mappings that use them are published,
    /// so a stack being unwound meanwhile reads valid entries.
    pub(crate) fn install(
        &self,
        pid: u32,
        capacity: usize,
        installed: &mut Installed,
        publish: impl FnOnce(&[BpfMapping]),
    ) -> Result<()> {
        let mut inner = self.lock();
        let Inner {
            arena,
            processes,
            kernel,
        } = &mut *inner;
        let Some(k) = kernel else {
            return Ok(());
        };
        let rows = append_array(&k.rows, &mut k.rows_written, &arena.rows, |r| *r)?;
        let pages = append_array(&k.pages, &mut k.pages_written, &arena.pages, |p| *p)?;
        let Some(p) = processes.get_mut(&pid) else {
            return Ok(());
        };
        if installed.generation == Some(p.generation) {
            return Ok(());
        }
        let list = &p.mappings.list;
        if !p.warned {
            if rows < arena.rows.len() || pages < arena.pages.len() {
                p.warned = true;
                say!(
                    "myprobe: warning: the unwind tables of code loaded while tracing do not fit ({} rows for \
                     {}): its stacks are walked with frame pointers",
                    k.rows.max_entries(),
                    arena.rows.len()
                );
            } else if list.len() > capacity {
                p.warned = true;
                say!(
                    "myprobe: warning: more than {capacity} executable mappings: those above {:#x} are \
                     unwound with frame pointers",
                    list[capacity].start
                );
            }
        }
        let usable: Vec<BpfMapping> = list
            .iter()
            .take(capacity)
            .map(|m| {
                let fits = (m.row_start + m.row_count) as usize <= rows
                    && (m.page_start + m.page_count + 1) as usize <= pages;
                if fits {
                    *m
                } else {
                    BpfMapping { row_count: 0, ..*m }
                }
            })
            .collect();
        publish(&usable);
        installed.generation = Some(p.generation);
        Ok(())
    }

    /// Runs `f` on the tables of `pid` (empty if the store does not hold it), for an unwind in user space.
    pub fn with_tables<R>(&self, pid: u32, f: impl FnOnce(Tables<'_>) -> R) -> R {
        let inner = self.lock();
        let mappings = inner
            .processes
            .get(&pid)
            .map_or(&[][..], |p| &p.mappings.list[..]);
        f(Tables {
            rows: &inner.arena.rows,
            pages: &inner.arena.pages,
            mappings,
        })
    }
}

impl Process {
    fn new(mappings: Mappings) -> Process {
        Process {
            mappings,
            generation: 0,
            refreshed: Instant::now(),
            warned: false,
        }
    }
}

impl Kernel {
    fn new(rows: usize, pages: usize) -> Result<Kernel> {
        let opts = libbpf_sys::bpf_map_create_opts {
            sz: std::mem::size_of::<libbpf_sys::bpf_map_create_opts>() as _,
            map_flags: libbpf_sys::BPF_F_MMAPABLE,
            ..Default::default()
        };
        let array = |name: &str, value: usize, entries: usize| {
            MapHandle::create(
                MapType::Array,
                Some(name),
                4,
                value as u32,
                entries as u32,
                &opts,
            )
            .with_context(|| format!("making the map {name} of {entries} entries"))
        };
        Ok(Kernel {
            rows: array("unwind_rows", std::mem::size_of::<BpfRow>(), rows)?,
            pages: array("unwind_pages", 4, pages)?,
            rows_written: 0,
            pages_written: 0,
        })
    }
}

// SAFETY: `struct unwind_row` of unwind.h, integers only, laid out as the BPF side's.
unsafe impl Plain for BpfRow {}

/// The agent's stores: a server's tables join a store of servers traced already when they fit (its code is
/// theirs), else make a store of their own.
#[derive(Default)]
pub struct Stores(Mutex<Vec<Weak<UnwindStore>>>);

impl Stores {
    /// The store for `pid`'s tables.
    pub fn for_process(&self, pid: u32) -> Result<Arc<UnwindStore>> {
        let mut compiled =
            Compiled::read(pid).context("reading the unwind tables of the process")?;
        let mut stores = self.0.lock().unwrap_or_else(|e| e.into_inner());
        stores.retain(|s| s.strong_count() > 0);
        for store in stores.iter().filter_map(Weak::upgrade) {
            match store.join(pid, compiled) {
                None => return Ok(store),
                Some(back) => compiled = back,
            }
        }
        let (store, warnings) = UnwindStore::of_compiled(pid, compiled);
        for w in &warnings {
            say!("myprobe: warning: {w}");
        }
        stores.push(Arc::downgrade(&store));
        Ok(store)
    }
}

/// Writes `items[*done..]`, converted, into an array map at the same indexes, as far as it holds; returns
/// how far it got. The map is written in place where the kernel lets it be mapped (`BPF_F_MMAPABLE`): a
/// server's hundreds of thousands of rows cost a syscall's checks each through the batch call (a fifth of a
/// snapshot's time).
fn append_array<U, T: Plain>(
    map: &dyn MapCore,
    done: &mut usize,
    items: &[U],
    convert: impl Fn(&U) -> T,
) -> Result<usize> {
    let end = items.len().min(map.max_entries() as usize);
    let start = (*done).min(end);
    if start == end {
        return Ok(end);
    }
    // The kernel lays an array's values 8-byte aligned.
    let stride = (map.value_size() as usize + 7) & !7;
    if map.value_size() as usize == std::mem::size_of::<T>() {
        if let Ok(mut values) = mapped_array(map, stride) {
            for (i, item) in items[start..end].iter().enumerate() {
                let at = (start + i) * stride;
                values[at..at + std::mem::size_of::<T>()]
                    .copy_from_slice(as_bytes(std::slice::from_ref(&convert(item))));
            }
            *done = end;
            return Ok(end);
        }
    }
    for (i, chunk) in items[start..end].chunks(65536).enumerate() {
        let first = (start + i * 65536) as u32;
        let keys: Vec<u8> = (first..first + chunk.len() as u32)
            .flat_map(u32::to_ne_bytes)
            .collect();
        let values: Vec<T> = chunk.iter().map(&convert).collect();
        map.update_batch(
            &keys,
            as_bytes(&values),
            chunk.len() as u32,
            MapFlags::ANY,
            MapFlags::ANY,
        )
        .context("loading unwind tables into the kernel")?;
    }
    *done = end;
    Ok(end)
}

/// The values of `map`, an array of values `stride` bytes apart, mapped for writing.
fn mapped_array(map: &dyn MapCore, stride: usize) -> std::io::Result<memmap2::MmapMut> {
    use std::os::fd::AsRawFd;
    let len = map.max_entries() as usize * stride;
    // SAFETY: the map is an array made mmapable, `len` bytes of values the kernel keeps for its life; only the
    // values not yet published to the programs (`unwind_mappings`) are written, under the store's lock.
    unsafe {
        memmap2::MmapOptions::new()
            .len(len)
            .map_mut(map.as_fd().as_raw_fd())
    }
}
