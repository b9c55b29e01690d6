// kiln's prelude, pre-included into every CUDA candidate (written for kiln). NVRTC brings
// no C library, so what nvcc users get for free from the host headers is defined here:
// the fixed-width integer types (and glibc's uint, ushort, ulong), the integer and
// floating-point limits, and the math constants (INFINITY, NAN, M_PI, ...). Macros and
// typedefs only, so it costs nothing.
#pragma once
#include <stdint.h>
#include <stddef.h>
#include <limits.h>
#include <float.h>
#include <kiln/math_constants.h>
// glibc's <sys/types.h> shorthands, which nvcc users get through the host headers.
typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned long ulong;
