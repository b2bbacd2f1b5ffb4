/* uprobe sessions' kfuncs (6.13), whose prototype changed: without arguments at first, the program's context as
 * their argument since fentry/fexit sessions (7.0). Both forms are declared (libbpf flavours: the name before
 * `___` is the kernel's) and the one the kernel has is called; the verifier drops the other. */
#pragma once

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

extern bool bpf_session_is_return___noctx(void) __ksym __weak;
extern bool bpf_session_is_return___ctx(void *ctx) __ksym __weak;
extern __u64 *bpf_session_cookie___noctx(void) __ksym __weak;
extern __u64 *bpf_session_cookie___ctx(void *ctx) __ksym __weak;

static __always_inline bool session_is_return(void *ctx)
{
	if (bpf_ksym_exists(bpf_session_is_return___ctx))
		return bpf_session_is_return___ctx(ctx);
	return bpf_session_is_return___noctx();
}

static __always_inline __u64 *session_cookie(void *ctx)
{
	if (bpf_ksym_exists(bpf_session_cookie___ctx))
		return bpf_session_cookie___ctx(ctx);
	return bpf_session_cookie___noctx();
}
