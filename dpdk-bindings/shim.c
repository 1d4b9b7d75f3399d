/* One-line accessors for DPDK macros bindgen cannot turn into functions. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* CPU_ISSET */
#endif
#include "wrapper.h"

/* rte_errno is a per-lcore TLS macro (per_lcore__rte_errno). */
int sluice_errno(void) { return rte_errno; }

/* rte_lcore_cpuset returns a cpu_set_t by value, a type bindgen is not asked to bind:
 * answer one CPU at a time instead. 1 when lcore `lcore_id` may run on CPU `cpu`. */
int sluice_lcore_on_cpu(unsigned int lcore_id, unsigned int cpu)
{
    if (lcore_id >= RTE_MAX_LCORE || cpu >= CPU_SETSIZE)
        return 0;
    rte_cpuset_t set = rte_lcore_cpuset(lcore_id);
    return CPU_ISSET(cpu, &set) ? 1 : 0;
}
