/* The C baseline of issue 19's marginal-operator line: all 2-way marginals of
 * 16 columns of in-memory codes (one byte per cell, the bench-data domain
 * sizes plus a null code), counted by a plain pair-by-pair loop on one core.
 * Prints rows per second per core. Compare with
 *   dpflow-bench marginals --input FILE --domain bench.yaml --k 2 --engine exec
 * whose rows/s/core is rows / (user + sys CPU seconds) under /usr/bin/time.
 *
 *   cc -O3 -march=native -o /tmp/mk benches/c/marginal_kernel.c && /tmp/mk 10000000
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* bench-data's 16 columns; +1 for the null code. */
static const int SIZES[16] = {100, 2, 9, 5, 6, 16, 4, 25, 20, 10, 50, 10, 3, 50, 100, 2};

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 10000000;
  uint8_t *col[16];
  uint64_t x = 88172645463325252ull;
  for (int c = 0; c < 16; c++) {
    col[c] = malloc(n);
    for (long r = 0; r < n; r++) {
      x ^= x << 13; x ^= x >> 7; x ^= x << 17;
      col[c][r] = (uint8_t)(x % (uint64_t)(SIZES[c] + 1));
    }
  }
  uint64_t check = 0;
  double t0 = now();
  for (int a = 0; a < 16; a++) {
    for (int b = a + 1; b < 16; b++) {
      int sb = SIZES[b] + 1;
      uint64_t *cnt = calloc((size_t)(SIZES[a] + 1) * sb, sizeof(uint64_t));
      const uint8_t *ca = col[a], *cb = col[b];
      for (long r = 0; r < n; r++) cnt[ca[r] * sb + cb[r]]++;
      check += cnt[0];
      free(cnt);
    }
  }
  double s = now() - t0;
  printf("rows=%ld marginals=120 seconds=%.3f rows_per_s_per_core=%.0f (check %llu)\n", n, s, n / s,
         (unsigned long long)check);
  return 0;
}
