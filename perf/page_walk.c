/*
 * What a random load costs once its line is cached but its page is not in the TLB:
 * the price of address translation alone, which `mem_floor.c` cannot separate from
 * the price of the memory.
 *
 * A pointer chase (each load's address is the value of the one before, so loads
 * cannot overlap) through LINES cache lines in random order, one line in each
 * STRIDE-byte block of one anonymous mapping advised MADV_HUGEPAGE, as the session
 * table's. The line's place within its block is hashed, so the lines spread over the
 * cache sets. With STRIDE 64 the lines are packed (the data's own cost: cache
 * latency); with STRIDE 4096 the same lines, the same bytes of data, lie one per
 * 4 KiB page over LINES * 4 KiB of address space. On a machine whose table pages
 * really are 2 MiB, the two agree until the span outgrows what the TLB maps in 2 MiB
 * pages (gigabytes); where the memory behind them is mapped in 4 KiB pages (a guest
 * whose host does not back it with huge pages: nested paging walks the host's
 * tables too), they part as soon as the span outgrows the TLB's 4 KiB reach.
 * Cycles are TSC cycles per load, over 2 000 000 loads after one warm-up lap.
 *
 *   gcc -O2 -o /tmp/page_walk perf/page_walk.c && /tmp/page_walk LINES STRIDE
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <x86intrin.h>

#define HUGE (2ul << 20)
#define LOADS 2000000

/* The offset of line `i` within its block: hashed, so the lines spread over the sets. */
static size_t line_in_block(size_t i, size_t stride)
{
	uint64_t h = i * 0x9E3779B97F4A7C15ull;
	return ((h >> 40) % (stride / 64)) * 64;
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: %s LINES STRIDE_BYTES\n", argv[0]);
		return 2;
	}
	size_t n = strtoul(argv[1], 0, 0), stride = strtoul(argv[2], 0, 0);
	if (n < 2 || stride < 64 || stride % 64 != 0) {
		fprintf(stderr, "LINES at least 2, STRIDE a multiple of 64\n");
		return 2;
	}
	size_t span = n * stride;
	/* Whole 2 MiB pages, so that even a packed span can be given one. */
	size_t mapped = (span + HUGE - 1) & ~(HUGE - 1);
	char *raw = mmap(0, mapped + HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (raw == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	char *p = (char *)(((uintptr_t)raw + HUGE - 1) & ~(uintptr_t)(HUGE - 1));
	madvise(p, mapped, MADV_HUGEPAGE);
	for (size_t i = 0; i < mapped; i += 4096)
		p[i] = 1;
	size_t *order = malloc(n * sizeof *order);
	if (!order) {
		perror("malloc");
		return 1;
	}
	for (size_t i = 0; i < n; i++)
		order[i] = i;
	uint64_t r = 88172645463325252ull;
	for (size_t i = n - 1; i > 0; i--) {
		r ^= r << 13;
		r ^= r >> 7;
		r ^= r << 17;
		size_t j = r % (i + 1), t = order[i];
		order[i] = order[j];
		order[j] = t;
	}
#define LINE(k) (p + order[k] * stride + line_in_block(order[k], stride))
	for (size_t i = 0; i < n; i++)
		*(char **)LINE(i) = LINE((i + 1) % n);
	char *q = LINE(0);
	for (size_t i = 0; i < n; i++)
		q = *(char **)q;
	uint64_t t = __rdtsc();
	for (size_t i = 0; i < LOADS; i++)
		q = *(char **)q;
	t = __rdtsc() - t;
	/* Whether the kernel gave the mapping 2 MiB pages (what the guest sees). */
	long huge_kib = -1;
	FILE *f = fopen("/proc/self/smaps_rollup", "r");
	char line[256];
	while (f && fgets(line, sizeof line, f))
		if (sscanf(line, "AnonHugePages: %ld kB", &huge_kib) == 1)
			break;
	if (f)
		fclose(f);
	printf("lines %zu (%zu KiB of lines) over %zu MiB (%ld MiB in 2 MiB pages): %.1f TSC cycles per load (%p)\n",
	       n, n * 64 >> 10, span >> 20, huge_kib >> 10, (double)t / LOADS, (void *)q);
	return 0;
}
