// Rows [lo, hi) in tiles of RMAX (= 6) then one of the rest: CALL(R) for each, `m` its first row
// (the GEMV's and the quantized GEMM's row tiles).
#pragma once
#define ROW_TILES(CALL)                         \
  int64_t m = lo;                               \
  for (; m + RMAX <= hi; m += RMAX) CALL(RMAX); \
  switch (hi - m) {                             \
    case 1: CALL(1); break;                     \
    case 2: CALL(2); break;                     \
    case 3: CALL(3); break;                     \
    case 4: CALL(4); break;                     \
    case 5: CALL(5); break;                     \
  }
