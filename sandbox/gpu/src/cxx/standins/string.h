// kiln stand-in for <string.h>: memcpy and memset are NVRTC built-ins in device code.
#pragma once
#include <stddef.h>
