// kiln stand-in for <math.h>: NVRTC declares the math functions itself (float and double
// overloads included); this adds the constants.
#pragma once
#include <kiln/math_constants.h>
