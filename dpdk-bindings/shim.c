/* One-line accessors for DPDK macros bindgen cannot turn into functions. */
#include "wrapper.h"

/* rte_errno is a per-lcore TLS macro (per_lcore__rte_errno). */
int sluice_errno(void) { return rte_errno; }
