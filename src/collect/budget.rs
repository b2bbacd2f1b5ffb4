//! The kernel memory that myprobe's maps may take (`--max-kernel-mem`): estimated before loading from each
//! map's type and sizes, as the kernel counts it, and fitted to the budget by shrinking the maps that can be
//! smaller at a known cost, which is said on stderr. Per-thread storage (task storage) is not in the budget:
//! it grows with the server's threads, a few KiB each.

use anyhow::{bail, Result};
use libbpf_rs::{MapType, OpenMap, OpenObject};

/// `--max-kernel-mem`, in MiB.
pub const DEFAULT_MIB: u64 = 256;

/// A map that may be given fewer entries than it asks for, and what that costs.
pub struct Degradable {
    pub map: &'static str,
    pub min_entries: u32,
    /// What the user loses, said with the entries kept (`{}` stands for them).
    pub cost: &'static str,
}

/// The maps every collector may shrink, in the order they are shrunk: memleak's table of allocations
/// outstanding (the largest by far), then the ring buffer.
pub const DEGRADABLE: &[Degradable] = &[
    Degradable {
        map: "outstanding",
        min_entries: 4096,
        cost: "at most {} allocations are followed at once; those beyond are counted as lost",
    },
    Degradable {
        map: "events",
        min_entries: 1 << 20,
        cost: "a ring buffer of {} bytes: bursts may drop events, counted as lost",
    },
];

/// Fits the maps of `object` (not yet loaded) into `budget` bytes, shrinking [`DEGRADABLE`] maps as needed;
/// returns the estimate of what they take. An error says what takes the memory when even the smallest
/// sizes do not fit. The maps named in `shared` are another's, counted where they were made (the unwind store's).
pub fn fit(object: &mut OpenObject, budget: u64, shared: &[&str]) -> Result<u64> {
    let cpus = libbpf_rs::num_possible_cpus().unwrap_or(1) as u64;
    let map_bytes = |m: &OpenMap<'_>| {
        if shared.iter().any(|s| m.name() == *s) {
            0
        } else {
            map_bytes(m, cpus)
        }
    };
    let total = |object: &OpenObject| -> u64 {
        object
            .maps()
            .map(|m| map_bytes(&m))
            .fold(0, u64::saturating_add)
    };
    let mut said = Vec::new();
    for d in DEGRADABLE {
        if total(object) <= budget {
            break;
        }
        let Some(entries) = object
            .maps()
            .find(|m| m.name() == d.map)
            .map(|m| m.max_entries())
        else {
            continue;
        };
        let ring = object
            .maps()
            .any(|m| m.name() == d.map && m.map_type() == MapType::RingBuf);
        // The most entries that fit, by halving: a ring buffer's size stays a power of two.
        let mut set = |n: u32| -> Result<u64> {
            if let Some(mut m) = object.maps_mut().find(|m| m.name() == d.map) {
                m.set_max_entries(n)?;
            }
            Ok(total(object))
        };
        let fits = if ring {
            let mut n = entries;
            while n > d.min_entries && set(n)? > budget {
                n /= 2;
            }
            n.max(d.min_entries)
        } else {
            let (mut lo, mut hi) = (d.min_entries.min(entries), entries);
            while lo < hi {
                let mid = lo + (hi - lo).div_ceil(2);
                if set(mid)? <= budget {
                    lo = mid;
                } else {
                    hi = mid - 1;
                }
            }
            lo
        };
        set(fits)?;
        if fits < entries {
            said.push(d.cost.replace("{}", &fits.to_string()));
        }
    }
    let used = total(object);
    if used > budget {
        let mut largest: Vec<(u64, String)> = object
            .maps()
            .map(|m| (map_bytes(&m), m.name().to_string_lossy().into_owned()))
            .collect();
        largest.sort_unstable_by(|a, b| b.cmp(a));
        let named: Vec<String> = largest
            .iter()
            .take(3)
            .map(|(bytes, name)| format!("{name} {:.1} MiB", *bytes as f64 / (1 << 20) as f64))
            .collect();
        bail!(
            "the BPF maps need {:.1} MiB of kernel memory ({}), more than --max-kernel-mem {} MiB allows: \
             raise it{}",
            used as f64 / (1 << 20) as f64,
            named.join(", "),
            budget >> 20,
            if largest.iter().any(|(_, n)| n.starts_with("unwind_")) {
                ", or walk stacks by frame pointers (--frame-pointers) without unwind tables"
            } else {
                ""
            }
        );
    }
    for cost in said {
        say!(
            "myprobe: to keep within --max-kernel-mem {} MiB: {cost}",
            budget >> 20
        );
    }
    Ok(used)
}

fn round8(n: u32) -> u64 {
    u64::from(n).div_ceil(8) * 8
}

/// What a map takes in the kernel, at most: its entries as the kernel lays them out (hash elements of 48
/// bytes of header, buckets of 16, per-CPU values once per CPU), allocated up front or, for maps that
/// allocate as entries come, once full.
fn map_bytes(map: &OpenMap<'_>, cpus: u64) -> u64 {
    bytes(
        map.map_type(),
        map.key_size(),
        map.value_size(),
        map.max_entries(),
        cpus,
    )
}

fn bytes(map_type: MapType, key: u32, value: u32, entries: u32, cpus: u64) -> u64 {
    let n = u64::from(entries);
    let (key, value) = (round8(key), round8(value));
    match map_type {
        MapType::Array => n * value,
        MapType::PercpuArray => n * value * cpus,
        MapType::Hash | MapType::LruHash => {
            (n + cpus) * (48 + key + value) + n.next_power_of_two() * 16
        }
        MapType::PercpuHash | MapType::LruPercpuHash => {
            (n + cpus) * (48 + key + 8 + value * cpus) + n.next_power_of_two() * 16
        }
        MapType::RingBuf => n + 4 * 4096,
        // Task storage: per thread, outside the budget; the others are not used here.
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use libbpf_rs::{libbpf_sys, MapCore, MapHandle};

    #[test]
    fn estimates_are_what_the_kernel_counts() {
        // The kernel's own count (memlock in fdinfo) of full preallocated maps, within 10%.
        let cpus = libbpf_rs::num_possible_cpus().unwrap() as u64;
        let opts = libbpf_sys::bpf_map_create_opts {
            sz: std::mem::size_of::<libbpf_sys::bpf_map_create_opts>() as _,
            ..Default::default()
        };
        for (map_type, key, value, entries) in [
            (MapType::Hash, 16, 24, 65536),
            (MapType::Hash, 8, 1, 32768),
            (MapType::Array, 4, 12, 441_218),
            (MapType::PercpuArray, 4, 4096, 1),
            (MapType::RingBuf, 0, 0, 4 << 20),
        ] {
            let map = MapHandle::create(map_type, Some("budget_test"), key, value, entries, &opts)
                .expect("creating a map (needs root)");
            let counted = map
                .query_fdinfo()
                .unwrap()
                .memlock
                .expect("memlock in fdinfo");
            let estimated = bytes(map_type, key, value, entries, cpus);
            assert!(
                estimated.abs_diff(counted) * 10 <= counted,
                "{map_type:?} {key}/{value}/{entries}: estimated {estimated}, the kernel counts {counted}"
            );
        }
    }
}
