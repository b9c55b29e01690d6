// kiln stand-in for <stdlib.h> (cuda.h includes it): device code needs nothing from it
// that NVRTC does not declare itself.
#pragma once
#include <stddef.h>
