// kiln stand-in for <math.h>: NVRTC declares the math functions itself (float and double
// overloads included); this adds the constants, and the mixed float/double overloads that
// the host's <cmath> adds (they promote to double), so pow(x, 3.0) with a float x is not
// ambiguous.
#pragma once
#include <kiln/math_constants.h>
#define KILN_MIXED(f) \
  __device__ inline double f(float a, double b) { return ::f((double)a, b); } \
  __device__ inline double f(double a, float b) { return ::f(a, (double)b); }
KILN_MIXED(pow)
KILN_MIXED(fmax)
KILN_MIXED(fmin)
KILN_MIXED(atan2)
KILN_MIXED(fmod)
KILN_MIXED(hypot)
KILN_MIXED(copysign)
KILN_MIXED(remainder)
KILN_MIXED(fdim)
#undef KILN_MIXED
