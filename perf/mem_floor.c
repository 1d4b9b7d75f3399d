/*
 * The memory floor of a machine for a session lookup: what random cache lines cost
 * per packet when every one is prefetched a whole burst ahead, with no other work.
 * An established packet reads two random lines (its index bucket and its session
 * entry, both prefetched by the burst's first pass); this measures that pattern in
 * a bare loop, so the figure is the machine's, not Sluice's.
 *
 * Per "packet" of a burst of 32: the burst's lines are prefetched first (all first
 * lines, then all second lines, as `Forwarder::prefetch_sessions` does), then each
 * packet reads its lines and does a few cycles of dependent work. Cycles are TSC
 * cycles per packet, averaged over 100 000 bursts.
 *
 *   gcc -O2 -o /tmp/mem_floor perf/mem_floor.c && /tmp/mem_floor LINES SPAN_MIB
 *
 * LINES is 1 or 2 random lines per packet; SPAN_MIB the size of the memory they are
 * drawn from (88 MiB is a 1M-session table: 64-byte entries and the index). The
 * memory is one anonymous mapping advised MADV_HUGEPAGE, as the session table's.
 * Compare a span far larger than the last-level cache with one inside L2 (1 MiB): the
 * difference is what the memory system charges per packet for the lines alone.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <x86intrin.h>

#define BURST 32
#define BURSTS 100000
#define HUGE (2ul << 20)

static uint64_t rng = 88172645463325252ull;

static uint64_t next(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: %s LINES(1|2) SPAN_MIB\n", argv[0]);
		return 2;
	}
	int lines = atoi(argv[1]);
	size_t span = strtoul(argv[2], 0, 0) << 20;
	if ((lines != 1 && lines != 2) || span < 4096) {
		fprintf(stderr, "LINES is 1 or 2, SPAN_MIB at least 1\n");
		return 2;
	}
	char *raw = mmap(0, span + HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (raw == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	char *p = (char *)(((uintptr_t)raw + HUGE - 1) & ~(uintptr_t)(HUGE - 1));
	madvise(p, span, MADV_HUGEPAGE);
	for (size_t i = 0; i < span; i += 4096)
		p[i] = 1;
	size_t n = span / 64;
	uint64_t a[BURST], b[BURST], total = 0;
	volatile uint64_t sink = 0;
	for (int it = 0; it < BURSTS; it++) {
		for (int i = 0; i < BURST; i++) {
			a[i] = next() % n;
			b[i] = next() % n;
		}
		uint64_t t = __rdtsc();
		for (int i = 0; i < BURST; i++)
			_mm_prefetch(p + a[i] * 64, _MM_HINT_T0);
		if (lines == 2)
			for (int i = 0; i < BURST; i++)
				_mm_prefetch(p + b[i] * 64, _MM_HINT_T0);
		for (int i = 0; i < BURST; i++) {
			sink += p[a[i] * 64];
			if (lines == 2)
				sink += p[b[i] * 64];
			for (volatile int k = 0; k < 20; k++)
				;
		}
		total += __rdtsc() - t;
	}
	printf("lines %d span %zu MiB: %.1f TSC cycles per packet\n", lines, span >> 20,
	       (double)total / BURSTS / BURST);
	return 0;
}
