// DC_CHECK: aborts on a broken internal invariant (never on bad input: use Status for that).
#pragma once

#include <cstdio>
#include <cstdlib>

#define DC_CHECK(cond, msg)                                                                   \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      std::fprintf(stderr, "%s:%d: check failed: %s (%s)\n", __FILE__, __LINE__, #cond, msg); \
      std::abort();                                                                           \
    }                                                                                         \
  } while (0)
