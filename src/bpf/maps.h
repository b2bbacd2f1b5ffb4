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
