/* Map helpers every collector uses. */
#pragma once

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

/* The value of `key` in a hash map, inserted as a copy of `init` when missing (bcc's
 * bpf_map_lookup_or_try_init); 0 when the map is full. */
static __always_inline void *lookup_or_init(void *map, const void *key, const void *init)
{
	void *value = bpf_map_lookup_elem(map, key);
	if (value)
		return value;
	bpf_map_update_elem(map, key, init, BPF_NOEXIST);
	return bpf_map_lookup_elem(map, key);
}

/* n, known to be in [1, max] (max a power of two), bounded again on the very register it is used from: clang
 * checks one copy of a value and passes another, or reloads it from the stack, and verifiers before about 6.3
 * lose its bounds on the way. The asm hides the value, so the mask is not optimized away as void. */
#define BOUNDED_SIZE(n, max)                                                                              \
	({                                                                                                \
		__u64 __n = (n);                                                                          \
		asm volatile("%[v] += -1; %[v] &= %[m]; %[v] += 1" : [v] "+r"(__n) : [m] "i"((max) - 1)); \
		__n;                                                                                      \
	})
